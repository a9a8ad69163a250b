# Schema 1.1 of common/schema/replay.capnp, frozen: what a reader built before 1.2 sees. The
# compatibility test reads newer messages with it and writes older ones. Never edit it.
@0xe5bc41b0a5a224eb;

$import "/capnp/c++.capnp".namespace("strider::schema::wire_1_1");

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

struct Step {
  # A model turn ending before segment offset `end` (exclusive) and its process reward.
  end @0 :UInt32;
  processReward @1 :Float32;
}

struct RoutingRecord {
  # The experts chosen for every action token (roles model and toolCall), packed as
  # little-endian uint16: [action token][layer][k]. Length = actions * layers * topK * 2 bytes.
  layers @0 :UInt16;
  topK @1 :UInt16;
  experts @2 :Data;
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
}

enum TrajectoryStatus {
  open @0;      # the last segment has not arrived
  complete @1;
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
