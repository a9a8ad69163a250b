# Wire and storage format of the replay service (docs/design.md#wire-schema and #replay-store).
#
# Every message travels in an envelope (common/schema/messages.h: magic, schema version, length,
# CRC32C) around one `Message`. A ZeroMQ frame holds one envelope, or several back to back when
# the server's credit allows it (`Credit.maxFrameBytes`). Segments are stored in RocksDB as the
# same envelope, so the checksum that guarded the wire also guards the disk.
#
# Compatibility: fields are only ever appended (new ordinals), never renumbered or retyped, and
# an appended field keeps the meaning of the old fields as they are: a reader of an older minor
# version reads a newer message as it always did, and a newer reader reads an older message with
# the new fields at their defaults (chosen to mean what the old message meant). Such a change
# bumps kSchemaMinor in messages.h; a change that old readers must not accept bumps kSchemaMajor.
# Fields marked "since 1.2" are absent (defaults) in messages whose envelope says 1.0 or 1.1.
@0xc4a1d2e39b7f5a60;

$import "/capnp/c++.capnp".namespace("strider::schema::wire");

enum Role {
  system @0;
  user @1;
  model @2;
  toolCall @3;
  toolResult @4;
  image @5;
}

struct PolicyRun {
  # Tokens from `begin` (offset inside the segment) up to the next run's begin were produced by
  # policy `version`. The first run begins at 0.
  begin @0 :UInt32;
  version @1 :UInt64;
}

enum StepLabel {
  unknown @0;    # the environment cannot judge the step
  correct @1;
  incorrect @2;
}

struct Step {
  # A model turn ending before segment offset `end` (exclusive) and its process reward.
  end @0 :UInt32;
  processReward @1 :Float32;    # 0 when hasReward is false
  # Since 1.2. A 1.1 writer stored 0 for a missing reward, and its readers took every stored
  # value as the reward: hence the default true.
  label @2 :StepLabel;
  hasReward @3 :Bool = true;
  index @4 :UInt32;             # the step's number in the trajectory, from 0
  begin @5 :UInt64;             # trajectory position of the step's first token (its turn's first
                                # action); the end in trajectory positions is tokenBegin + end
}

enum RoutingCoverage {
  actions @0;   # only action tokens have records (every 1.0 and 1.1 segment)
  all @1;       # every position has one: contextExperts covers every context token
  masked @2;    # the positions whose bit is set in `mask` have one
}

struct RoutingRecord {
  # The experts chosen for every action token (roles model and toolCall), packed as
  # little-endian uint16: [action token][layer][k]. Length = actions * layers * topK * 2 bytes.
  layers @0 :UInt16;
  topK @1 :UInt16;
  experts @2 :Data;
  # Since 1.2: the experts of context tokens too, which routing replay needs to recompute a
  # trajectory exactly. They travel beside `experts` so that its 1.1 meaning (and 1.1 readers'
  # length check) stays as it was.
  coverage @3 :RoutingCoverage;
  contextExperts @4 :Data;      # [context token with a record][layer][k], little-endian uint16
  mask @5 :Data;                # masked: bit i (byte i / 8, bit i % 8) set = token i has a
                                # record; ceil(tokens / 8) bytes, every action token's bit set
}

struct Image {
  # Raw pixels of an image placed at segment offset `tokenOffset` (its image-start marker).
  tokenOffset @0 :UInt32;
  width @1 :UInt32;
  height @2 :UInt32;
  channels @3 :UInt8;
  pixels @4 :Data;   # width * height * channels bytes, row-major, interleaved channels
}

struct KeyValue {
  key @0 :Text;
  value @1 :Text;
}

struct Segment {
  trajectoryId @0 :Data;        # 16 bytes
  segmentIndex @1 :UInt32;
  isLast @2 :Bool;              # the trajectory's final segment; carries the outcome reward
  tokenBegin @3 :UInt64;        # position of the first token inside the trajectory
  tokens @4 :Data;              # little-endian int32 per token
  roles @5 :Data;               # one Role value (uint8) per token
  behaviourLogprobs @6 :Data;   # little-endian float32 per token; 0 for context tokens
  policyRuns @7 :List(PolicyRun);
  routing @8 :RoutingRecord;
  steps @9 :List(Step);
  outcomeReward @10 :Float32;
  images @11 :List(Image);
  env @12 :Text;
  metadata @13 :List(KeyValue);
  stateDigest @14 :Data;        # digest of the inference state at the segment's start
  table @15 :Text;              # replay table; empty means the server's first table
  # Since 1.2, on every segment (sampling settings and the group are known from the start).
  groupId @16 :Data;            # 16 bytes, shared by the trajectories sampled from one prompt
  groupIndex @17 :UInt32;       # this trajectory's place in its group, from 0
  groupSize @18 :UInt32;        # trajectories the group started with; 0: no group (1.1)
  endReason @19 :EndReason;     # on the last segment; `none` on the others (sent before the end)
  # The distribution the behaviour log-probs are of (the image-patch placeholder is never
  # sampled, whatever these say). Defaults: plain sampling, as 1.1 messages do not say.
  temperature @20 :Float32 = 1.0;   # 0: greedy
  topP @21 :Float32 = 1.0;
  topK @22 :UInt32;                 # 0: no cut
}

enum EndReason {
  none @0;               # not the last segment, or a writer before 1.2
  finished @1;           # the environment said done
  truncatedTurns @2;     # the episode reached its turn limit
  truncatedLength @3;    # the next turn could pass the episode's token limit
  failed @4;             # environment, engine or actor error (metadata `status`, `error`)
  abandoned @5;          # cut short by its actor (stopped); also what the replay server
                         # writes into the summary of a trajectory it closes (abandon_after_s)
}

enum TrajectoryStatus {
  open @0;      # the last segment has not arrived
  complete @1;
  abandoned @2; # since 1.2: closed by the replay server after its actor went silent
                # (abandon_after_s); a 1.1 reader takes it for open
}

struct TrajectorySummary {
  trajectoryId @0 :Data;
  env @1 :Text;
  table @2 :Text;
  status @3 :TrajectoryStatus;
  segmentsStored @4 :UInt32;
  tokens @5 :UInt64;            # tokens in stored segments
  outcomeReward @6 :Float32;    # meaningful once complete
  processRewardSum @7 :Float32;
  steps @8 :UInt32;
  minPolicyVersion @9 :UInt64;
  maxPolicyVersion @10 :UInt64;
  firstInsertUnixMs @11 :UInt64;
  endReason @12 :EndReason;     # since 1.2: the last segment's
  conflicts @13 :UInt32;        # since 1.2: segments of this trajectory that arrived again
                                # with different bytes (refused with `conflict`, first kept)
}

enum ClientRole {
  actor @0;
  learner @1;
}

struct Hello {
  clientId @0 :Text;
  role @1 :ClientRole;
}

struct SegmentKey {
  trajectoryId @0 :Data;
  segmentIndex @1 :UInt32;
}

struct Ack {
  keys @0 :List(SegmentKey);    # durable: in the write-ahead log
}

struct Credit {
  # The most unacknowledged segment bytes (envelope sizes) the client may have in flight.
  bytes @0 :UInt64;
  serverInstance @1 :UInt64;    # changes when the server restarts
  # Frames holding several envelopes back to back are accepted up to this many bytes in all
  # (since 1.1); 0, as older servers send: one envelope per frame.
  maxFrameBytes @2 :UInt64;
}

struct SampleRequest {
  table @0 :Text;
  learnerId @1 :Text;
  step @2 :UInt64;              # the learner's sample step, from 1; a repeated step replays
  count @3 :UInt32;
  policyVersion @4 :UInt64;     # the learner's current version, for the staleness bound
  # Since 1.2, fetch by key (16 bytes): every stored segment of the trajectory or of the group's
  # trajectories, in order; nothing is sampled, step and count are ignored.
  fetchTrajectory @5 :Data;
  fetchGroup @6 :Data;
  # Since 1.3, a learner group of worldSize ranks (data parallel) shares one draw per step: the
  # first rank to ask for a step draws `count` units for the whole group and every rank gets
  # its slice, units [rank * n / worldSize, (rank + 1) * n / worldSize) of the n drawn. 0 and 1
  # both mean a learner alone.
  rank @7 :UInt32;
  worldSize @8 :UInt32;
}

struct SampledSegment {
  sequence @0 :UInt64;          # insertion number: the handle for priority updates
  segment @1 :Data;             # the stored envelope (checksummed Message with a segment)
  timesSampled @2 :UInt32;
}

struct SampleReply {
  step @0 :UInt64;
  segments @1 :List(SampledSegment);
  notReadyReason @2 :Text;      # why nothing was returned (rate limiter, empty table)
  replayed @3 :Bool;            # the step was answered before; the same segments again
}

struct PriorityUpdate {
  table @0 :Text;
  sequences @1 :List(UInt64);
  priorities @2 :List(Float64);
}

struct Error {
  reason @0 :Text;              # short machine-readable reason: "checksum", "version", ...
  message @1 :Text;
  key @2 :SegmentKey;           # the segment concerned, when it was known
}

struct Stats {
  json @0 :Text;
}

struct Message {
  union {
    hello @0 :Hello;
    segment @1 :Segment;
    ack @2 :Ack;
    credit @3 :Credit;
    sampleRequest @4 :SampleRequest;
    sampleReply @5 :SampleReply;
    priorityUpdate @6 :PriorityUpdate;
    error @7 :Error;
    statsRequest @8 :Void;
    stats @9 :Stats;
  }
}
