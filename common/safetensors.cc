// Safetensors I/O without LibTorch.
//
// Reading trusts nothing in the file: every length and offset is checked against the file size
// before any allocation or copy, so a truncated or hostile file yields a Status, never a crash
// or a huge allocation. The header is parsed as a DOM (headers are kilobytes to a few megabytes);
// tensor bytes are read with one pread per tensor straight into the tensor's buffer, in file
// order, so a file of hundreds of megabytes costs one pass over the data and no second copy.
//
// Writing lays tensors out like the reference implementation: ordered by element size (largest
// first) and then by name, after a header padded with spaces to a multiple of 8 bytes. With that
// order every tensor starts at a multiple of its element size, so a reader that maps the file
// can view tensors in place; and the output does not depend on the order the caller listed them.
#include "common/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "common/durable_file.h"
#include "common/file_closer.h"

namespace strider {
namespace {

using Json = nlohmann::json;

// The reference implementation refuses headers above 100 MB; a larger length field is a
// corrupt or hostile file, and refusing it early avoids allocating whatever it claims.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr const char* kMetadataKey = "__metadata__";

constexpr DType kAllDTypes[] = {DType::kF64, DType::kF32, DType::kF16, DType::kBF16,
                                DType::kI64, DType::kI32, DType::kI16, DType::kI8,
                                DType::kU8,  DType::kBool};

std::string ErrnoText(int error) { return std::strerror(error); }

// The number of elements of `shape`, or nullopt if a dimension is negative or the product (in
// bytes, times `element_size`) does not fit in 64 bits.
std::optional<uint64_t> ByteSizeOf(const std::vector<int64_t>& shape, size_t element_size) {
  uint64_t bytes = element_size;
  for (int64_t dim : shape) {
    if (dim < 0) return std::nullopt;
    if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(dim), &bytes)) return std::nullopt;
  }
  return bytes;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// Reads exactly `size` bytes at `offset`; a short read means the file shrank since fstat.
Status ReadAt(int fd, uint64_t offset, void* data, size_t size, const std::string& file) {
  auto* bytes = static_cast<uint8_t*>(data);
  while (size > 0) {
    ssize_t got = ::pread(fd, bytes, size, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      return Status::IoError(fmt::format("{}: read failed: {}", file, ErrnoText(errno)));
    }
    if (got == 0) {
      return Status::Corruption(
          fmt::format("{}: file ended at byte {} while reading (was it truncated during the "
                      "read?)",
                      file, offset));
    }
    bytes += got;
    size -= static_cast<size_t>(got);
    offset += static_cast<uint64_t>(got);
  }
  return Status::Ok();
}

// Parses `text` and reports the first key repeated within one object. nlohmann's DOM keeps
// the last of duplicate keys silently; for a weights file that would hide a second tensor of
// the same name, so we track the keys of every open object through the parser callback.
Result<Json> ParseHeaderJson(std::string_view text, const std::string& file) {
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  int duplicate_depth = 0;
  auto track = [&](int depth, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case Json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case Json::parse_event_t::key:
        if (!open_objects.empty() && duplicate.empty() &&
            !open_objects.back().insert(parsed.get<std::string>()).second) {
          duplicate = parsed.get<std::string>();
          duplicate_depth = depth;
        }
        break;
      default:
        break;
    }
    return true;
  };
  Json header;
  try {
    header = Json::parse(text.begin(), text.end(), track);
  } catch (const Json::exception& error) {
    return Status::Corruption(fmt::format("{}: header is not valid JSON: {}", file, error.what()));
  }
  if (!duplicate.empty()) {
    return Status::Corruption(fmt::format(
        "{}: header has duplicate key '{}'{}", file, duplicate,
        duplicate_depth <= 1 ? " (two tensors of the same name)" : " inside one entry"));
  }
  return header;
}

// Reads a JSON integer that must be non-negative and at most `max`.
std::optional<uint64_t> NonNegativeInteger(const Json& value, uint64_t max) {
  if (value.is_number_unsigned()) {
    uint64_t v = value.get<uint64_t>();
    if (v <= max) return v;
    return std::nullopt;
  }
  if (value.is_number_integer()) {
    int64_t v = value.get<int64_t>();
    if (v >= 0 && static_cast<uint64_t>(v) <= max) return static_cast<uint64_t>(v);
  }
  return std::nullopt;
}

using EntryInfo = SafetensorsEntry;

// Validates one tensor entry of the header on its own (everything except its relation to the
// other entries). `data_size` is the size of the data section after the header.
Result<EntryInfo> ParseEntry(const std::string& name, const Json& entry, uint64_t data_size,
                             const std::string& file) {
  const std::string where = fmt::format("{}: tensor '{}'", file, name);
  if (!entry.is_object()) {
    return Status::Corruption(
        fmt::format("{}: entry is a JSON {}, expected an object", where, entry.type_name()));
  }
  for (const auto& [key, value] : entry.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      return Status::Corruption(fmt::format(
          "{}: unknown field '{}' (expected dtype, shape, data_offsets)", where, key));
    }
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!entry.contains(key)) {
      return Status::Corruption(fmt::format("{}: missing field '{}'", where, key));
    }
  }
  EntryInfo info;
  info.name = name;

  const Json& dtype = entry["dtype"];
  if (!dtype.is_string()) {
    return Status::Corruption(fmt::format("{}: dtype is a JSON {}, expected a string", where,
                                          dtype.type_name()));
  }
  Result<DType> parsed = ParseDType(dtype.get<std::string>());
  if (!parsed.ok()) return Status::Corruption(fmt::format("{}: {}", where, parsed.status().message()));
  info.dtype = *parsed;

  const Json& shape = entry["shape"];
  if (!shape.is_array()) {
    return Status::Corruption(fmt::format("{}: shape is a JSON {}, expected an array of integers",
                                          where, shape.type_name()));
  }
  for (size_t i = 0; i < shape.size(); ++i) {
    const Json& dim = shape[i];
    if (dim.is_number_integer() && !dim.is_number_unsigned() && dim.get<int64_t>() < 0) {
      return Status::Corruption(
          fmt::format("{}: shape[{}] is {}, a negative dimension", where, i, dim.get<int64_t>()));
    }
    std::optional<uint64_t> value =
        NonNegativeInteger(dim, static_cast<uint64_t>(std::numeric_limits<int64_t>::max()));
    if (!value) {
      return Status::Corruption(
          fmt::format("{}: shape[{}] is {}, expected a non-negative integer", where, i, dim.dump()));
    }
    info.shape.push_back(static_cast<int64_t>(*value));
  }

  const Json& offsets = entry["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2) {
    return Status::Corruption(fmt::format(
        "{}: data_offsets is {}, expected [begin, end]", where, offsets.dump()));
  }
  std::optional<uint64_t> begin = NonNegativeInteger(offsets[0], data_size);
  std::optional<uint64_t> end = NonNegativeInteger(offsets[1], data_size);
  if (!begin || !end) {
    return Status::Corruption(fmt::format(
        "{}: data_offsets {} out of range: the data section holds {} bytes", where,
        offsets.dump(), data_size));
  }
  if (*begin > *end) {
    return Status::Corruption(
        fmt::format("{}: data_offsets {} end before they begin", where, offsets.dump()));
  }
  info.begin = *begin;
  info.end = *end;

  std::optional<uint64_t> expected = ByteSizeOf(info.shape, DTypeSize(info.dtype));
  if (!expected) {
    return Status::Corruption(
        fmt::format("{}: shape {} is too large", where, ShapeText(info.shape)));
  }
  if (*expected != info.end - info.begin) {
    return Status::Corruption(fmt::format(
        "{}: data_offsets {} span {} bytes, but shape {} of {} needs {} bytes", where,
        offsets.dump(), info.end - info.begin, ShapeText(info.shape), DTypeName(info.dtype),
        *expected));
  }
  return info;
}

Result<std::map<std::string, std::string>> ParseMetadata(const Json& metadata,
                                                          const std::string& file) {
  if (!metadata.is_object()) {
    return Status::Corruption(fmt::format("{}: {} is a JSON {}, expected an object of strings",
                                          file, kMetadataKey, metadata.type_name()));
  }
  std::map<std::string, std::string> result;
  for (const auto& [key, value] : metadata.items()) {
    if (!value.is_string()) {
      return Status::Corruption(fmt::format("{}: {} value of '{}' is a JSON {}, expected a string",
                                            file, kMetadataKey, key, value.type_name()));
    }
    result.emplace(key, value.get<std::string>());
  }
  return result;
}

}  // namespace

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF64: return "F64";
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kI64: return "I64";
    case DType::kI32: return "I32";
    case DType::kI16: return "I16";
    case DType::kI8: return "I8";
    case DType::kU8: return "U8";
    case DType::kBool: return "BOOL";
  }
  return "?";
}

Result<DType> ParseDType(std::string_view name) {
  for (DType dtype : kAllDTypes) {
    if (DTypeName(dtype) == name) return dtype;
  }
  std::vector<std::string_view> known;
  for (DType dtype : kAllDTypes) known.push_back(DTypeName(dtype));
  return Status::InvalidArgument(
      fmt::format("unknown dtype '{}' (supported: {})", name, fmt::join(known, ", ")));
}

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF64:
    case DType::kI64:
      return 8;
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
    case DType::kI16:
      return 2;
    case DType::kI8:
    case DType::kU8:
    case DType::kBool:
      return 1;
  }
  return 0;
}

namespace {

// The 8-byte length and the padded header of `tensors`, and the order their bytes follow it in.
// Everything is validated here, before a file exists or a buffer grows, so a bad argument never
// touches the disk. `path` names the destination in errors.
Result<std::string> EncodeHeader(const std::string& path, const std::vector<TensorView>& tensors,
                                 const std::map<std::string, std::string>& metadata,
                                 std::vector<const TensorView*>* order_out,
                                 bool bytes_given = true) {
  std::set<std::string_view> names;
  for (const TensorView& view : tensors) {
    const std::string where = fmt::format("{}: tensor '{}'", path, view.name);
    if (view.name == kMetadataKey) {
      return Status::InvalidArgument(
          fmt::format("{}: the name is reserved for the metadata", where));
    }
    if (!names.insert(view.name).second) {
      return Status::InvalidArgument(fmt::format("{}: duplicate tensor name", where));
    }
    std::optional<uint64_t> expected = ByteSizeOf(view.shape, DTypeSize(view.dtype));
    if (!expected) {
      return Status::InvalidArgument(fmt::format(
          "{}: shape {} has a negative dimension or is too large", where, ShapeText(view.shape)));
    }
    if (*expected != view.byte_size) {
      return Status::InvalidArgument(
          fmt::format("{}: byte_size is {}, but shape {} of {} needs {} bytes", where,
                      view.byte_size, ShapeText(view.shape), DTypeName(view.dtype), *expected));
    }
    if (bytes_given && view.byte_size > 0 && view.data == nullptr) {
      return Status::InvalidArgument(fmt::format("{}: data is null", where));
    }
  }

  std::vector<const TensorView*>& order = *order_out;
  order.clear();
  order.reserve(tensors.size());
  for (const TensorView& view : tensors) order.push_back(&view);
  std::sort(order.begin(), order.end(), [](const TensorView* a, const TensorView* b) {
    size_t size_a = DTypeSize(a->dtype), size_b = DTypeSize(b->dtype);
    if (size_a != size_b) return size_a > size_b;
    return a->name < b->name;
  });

  // ordered_json keeps the metadata first and the tensors in data order, as the reference
  // writer does, which makes the header easy to read by eye.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
    header[kMetadataKey] = std::move(meta);
  }
  uint64_t offset = 0;
  for (const TensorView* view : order) {
    header[view->name] = {{"dtype", std::string(DTypeName(view->dtype))},
                          {"shape", view->shape},
                          {"data_offsets", {offset, offset + view->byte_size}}};
    offset += view->byte_size;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::ordered_json::exception& error) {
    // dump() refuses strings that are not UTF-8, which JSON requires.
    return Status::InvalidArgument(
        fmt::format("{}: a tensor name or metadata entry is not valid UTF-8: {}", path,
                    error.what()));
  }
  text.append((8 - text.size() % 8) % 8, ' ');

  std::string prefix(8, '\0');
  for (int i = 0; i < 8; ++i) {
    prefix[i] = static_cast<char>((static_cast<uint64_t>(text.size()) >> (8 * i)) & 0xff);
  }
  prefix += text;
  return prefix;
}

// The header's length from the first 8 bytes, checked against the limit and the total size.
Result<uint64_t> HeaderLength(const uint8_t* length_bytes, uint64_t total_size,
                              const std::string& path) {
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | length_bytes[i];
  if (header_size > kMaxHeaderBytes) {
    return Status::Corruption(fmt::format("{}: header length {} exceeds the limit of {} bytes",
                                          path, header_size, kMaxHeaderBytes));
  }
  if (header_size > total_size - 8) {
    return Status::Corruption(fmt::format(
        "{}: header length {} runs past the end of the file ({} bytes)", path, header_size,
        total_size));
  }
  return header_size;
}

// Parses the header and checks its entries against a data section of `data_size` bytes: the
// metadata goes to `contents`, the entries come back in data order.
Result<std::vector<EntryInfo>> ParseLayout(const std::string& header_text, uint64_t data_size,
                                           const std::string& path, SafetensorsContents* contents) {
  STRIDER_ASSIGN_OR_RETURN(Json header, ParseHeaderJson(header_text, path));
  if (!header.is_object()) {
    return Status::Corruption(
        fmt::format("{}: header is a JSON {}, expected an object", path, header.type_name()));
  }
  std::vector<EntryInfo> entries;
  entries.reserve(header.size());
  for (const auto& [name, entry] : header.items()) {
    if (name == kMetadataKey) {
      STRIDER_ASSIGN_OR_RETURN(contents->metadata, ParseMetadata(entry, path));
      continue;
    }
    STRIDER_ASSIGN_OR_RETURN(EntryInfo parsed, ParseEntry(name, entry, data_size, path));
    entries.push_back(std::move(parsed));
  }

  // The ranges, in file order, must tile the data section exactly: no overlap (two tensors
  // sharing bytes), no gap and no trailing bytes (data no tensor accounts for, which usually
  // means a damaged header).
  std::sort(entries.begin(), entries.end(), [](const EntryInfo& a, const EntryInfo& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  uint64_t covered = 0;
  const EntryInfo* previous = nullptr;
  for (const EntryInfo& entry : entries) {
    if (entry.begin < covered) {
      return Status::Corruption(fmt::format(
          "{}: tensor '{}': data_offsets [{}, {}] overlap tensor '{}' ending at {}", path,
          entry.name, entry.begin, entry.end, previous->name, covered));
    }
    if (entry.begin > covered) {
      return Status::Corruption(fmt::format(
          "{}: tensor '{}': gap of {} bytes before its data_offsets [{}, {}]", path, entry.name,
          entry.begin - covered, entry.begin, entry.end));
    }
    covered = entry.end;
    previous = &entry;
  }
  if (covered != data_size) {
    return Status::Corruption(fmt::format(
        "{}: {} trailing bytes after the last tensor{}: the data section holds {} bytes, the "
        "tensors account for {}",
        path, data_size - covered,
        previous ? fmt::format(" ('{}')", previous->name) : std::string(" (there are none)"),
        data_size, covered));
  }
  return entries;
}

}  // namespace

Result<std::string> EncodeSafetensors(const std::vector<TensorView>& tensors,
                                      const std::map<std::string, std::string>& metadata) {
  std::vector<const TensorView*> order;
  STRIDER_ASSIGN_OR_RETURN(std::string bytes,
                           EncodeHeader("safetensors buffer", tensors, metadata, &order));
  size_t total = bytes.size();
  for (const TensorView* view : order) total += view->byte_size;
  bytes.reserve(total);
  for (const TensorView* view : order) {
    bytes.append(static_cast<const char*>(view->data), view->byte_size);
  }
  return bytes;
}

Result<SafetensorsContents> DecodeSafetensors(std::string_view bytes, const std::string& name) {
  if (bytes.size() < 8) {
    return Status::Corruption(fmt::format(
        "{}: buffer is {} bytes, shorter than the 8-byte header length", name, bytes.size()));
  }
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  STRIDER_ASSIGN_OR_RETURN(uint64_t header_size, HeaderLength(data, bytes.size(), name));
  const uint64_t data_start = 8 + header_size;
  SafetensorsContents contents;
  STRIDER_ASSIGN_OR_RETURN(
      std::vector<EntryInfo> entries,
      ParseLayout(std::string(bytes.substr(8, header_size)), bytes.size() - data_start, name,
                  &contents));
  for (EntryInfo& entry : entries) {
    LoadedTensor tensor;
    tensor.dtype = entry.dtype;
    tensor.shape = std::move(entry.shape);
    tensor.bytes.assign(data + data_start + entry.begin, data + data_start + entry.end);
    contents.tensors.emplace(std::move(entry.name), std::move(tensor));
  }
  return contents;
}

Status WriteSafetensors(const std::string& path, const std::vector<TensorView>& tensors,
                        const std::map<std::string, std::string>& metadata,
                        const std::function<void(const TensorView&)>& written) {
  std::vector<const TensorView*> order;
  STRIDER_ASSIGN_OR_RETURN(std::string prefix, EncodeHeader(path, tensors, metadata, &order));
  return WriteFileDurablyStreamed(path, [&](const FileAppender& append) -> Status {
    STRIDER_RETURN_IF_ERROR(append(prefix));
    for (const TensorView* view : order) {
      STRIDER_RETURN_IF_ERROR(
          append(std::string_view(static_cast<const char*>(view->data), view->byte_size))
              .WithContext(fmt::format("tensor '{}'", view->name)));
      if (written) written(*view);
    }
    return Status::Ok();
  });
}

Status WriteSafetensorsProduced(const std::string& path, const std::vector<TensorView>& tensors,
                                const TensorProducer& produce,
                                const std::map<std::string, std::string>& metadata) {
  std::vector<const TensorView*> order;
  STRIDER_ASSIGN_OR_RETURN(std::string prefix,
                           EncodeHeader(path, tensors, metadata, &order, /*bytes_given=*/false));
  return WriteFileDurablyStreamed(path, [&](const FileAppender& append) -> Status {
    STRIDER_RETURN_IF_ERROR(append(prefix));
    for (const TensorView* view : order) {
      // The header already promised byte_size bytes: hold the producer to it, or every later
      // tensor would be read from the wrong offset.
      uint64_t appended = 0;
      const FileAppender counted = [&](std::string_view bytes) {
        appended += bytes.size();
        if (appended > view->byte_size) {
          return Status::Internal(fmt::format("{}: tensor '{}': produced more than its {} bytes",
                                              path, view->name, view->byte_size));
        }
        return append(bytes);
      };
      STRIDER_RETURN_IF_ERROR(produce(*view, counted));
      if (appended != view->byte_size) {
        return Status::Internal(fmt::format("{}: tensor '{}': produced {} of its {} bytes", path,
                                            view->name, appended, view->byte_size));
      }
    }
    return Status::Ok();
  });
}

namespace {

// Opens `path` for reading and checks it is a regular file; the size goes to `size`.
Result<int> OpenForReading(const std::string& path, uint64_t* size) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int error = errno;
    std::string message = fmt::format("{}: cannot open: {}", path, ErrnoText(error));
    if (error == ENOENT) return Status::NotFound(std::move(message));
    return Status::IoError(std::move(message));
  }
  struct stat info;
  if (::fstat(fd, &info) != 0) {
    int error = errno;
    ::close(fd);
    return Status::IoError(fmt::format("{}: fstat failed: {}", path, ErrnoText(error)));
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd);
    return Status::InvalidArgument(fmt::format("{}: not a regular file", path));
  }
  *size = static_cast<uint64_t>(info.st_size);
  return fd;
}

Result<SafetensorsHeader> ReadHeaderFrom(int fd, uint64_t file_size, const std::string& path) {
  if (file_size < 8) {
    return Status::Corruption(fmt::format(
        "{}: file is {} bytes, shorter than the 8-byte header length", path, file_size));
  }
  uint8_t length_bytes[8];
  STRIDER_RETURN_IF_ERROR(ReadAt(fd, 0, length_bytes, 8, path));
  STRIDER_ASSIGN_OR_RETURN(uint64_t header_size, HeaderLength(length_bytes, file_size, path));
  SafetensorsHeader header;
  header.file_size = file_size;
  header.data_start = 8 + header_size;
  std::string header_text(header_size, '\0');
  STRIDER_RETURN_IF_ERROR(ReadAt(fd, 8, header_text.data(), header_size, path));
  SafetensorsContents contents;
  STRIDER_ASSIGN_OR_RETURN(header.entries,
                           ParseLayout(header_text, file_size - header.data_start, path,
                                       &contents));
  header.metadata = std::move(contents.metadata);
  return header;
}

}  // namespace

Result<SafetensorsContents> ReadSafetensors(const std::string& path) {
  uint64_t file_size = 0;
  STRIDER_ASSIGN_OR_RETURN(int fd, OpenForReading(path, &file_size));
  FileCloser closer(fd);
  STRIDER_ASSIGN_OR_RETURN(SafetensorsHeader header, ReadHeaderFrom(fd, file_size, path));
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  SafetensorsContents contents;
  contents.metadata = std::move(header.metadata);
  for (EntryInfo& entry : header.entries) {
    LoadedTensor tensor;
    tensor.dtype = entry.dtype;
    tensor.shape = std::move(entry.shape);
    tensor.bytes.resize(entry.end - entry.begin);
    STRIDER_RETURN_IF_ERROR(ReadAt(fd, header.data_start + entry.begin, tensor.bytes.data(),
                                   tensor.bytes.size(), path)
                                .WithContext(fmt::format("tensor '{}'", entry.name)));
    contents.tensors.emplace(std::move(entry.name), std::move(tensor));
  }
  return contents;
}

uint64_t SafetensorsEntry::Elements() const {
  uint64_t count = 1;
  for (int64_t dim : shape) count *= static_cast<uint64_t>(dim);
  return count;
}

const SafetensorsEntry* SafetensorsHeader::Find(std::string_view name) const {
  for (const SafetensorsEntry& entry : entries) {
    if (entry.name == name) return &entry;
  }
  return nullptr;
}

Result<SafetensorsHeader> ReadSafetensorsHeader(const std::string& path) {
  uint64_t file_size = 0;
  STRIDER_ASSIGN_OR_RETURN(int fd, OpenForReading(path, &file_size));
  FileCloser closer(fd);
  return ReadHeaderFrom(fd, file_size, path);
}

Result<std::unique_ptr<MappedSafetensors>> MappedSafetensors::Open(const std::string& path) {
  uint64_t file_size = 0;
  STRIDER_ASSIGN_OR_RETURN(int fd, OpenForReading(path, &file_size));
  FileCloser closer(fd);
  STRIDER_ASSIGN_OR_RETURN(SafetensorsHeader header, ReadHeaderFrom(fd, file_size, path));
  // The header check above proved every range lies inside these file_size bytes; a file that
  // shrinks while mapped would fault on access, which no check here can prevent, so the export
  // path reads shards nobody else writes.
  void* base = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (base == MAP_FAILED) {
    return Status::IoError(fmt::format("{}: mmap of {} bytes failed: {}", path, file_size,
                                       ErrnoText(errno)));
  }
  ::madvise(base, file_size, MADV_SEQUENTIAL);
  return std::unique_ptr<MappedSafetensors>(new MappedSafetensors(
      path, std::move(header), static_cast<const uint8_t*>(base), file_size));
}

MappedSafetensors::~MappedSafetensors() {
  if (base_ != nullptr) ::munmap(const_cast<uint8_t*>(base_), size_);
}

std::string_view MappedSafetensors::Bytes(const SafetensorsEntry& entry) const {
  return std::string_view(reinterpret_cast<const char*>(base_ + header_.data_start + entry.begin),
                          entry.end - entry.begin);
}

TensorView MappedSafetensors::View(const SafetensorsEntry& entry) const {
  TensorView view;
  view.name = entry.name;
  view.dtype = entry.dtype;
  view.shape = entry.shape;
  view.data = base_ + header_.data_start + entry.begin;
  view.byte_size = entry.end - entry.begin;
  return view;
}

void MappedSafetensors::Release(const SafetensorsEntry& entry) const {
  // madvise works on whole pages: only the pages entirely inside the tensor go. The partial
  // pages at its ends may hold a neighbour's bytes still to be read, so they stay (two pages
  // per tensor at most).
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t begin = header_.data_start + entry.begin;
  const uint64_t end = header_.data_start + entry.end;
  const uint64_t first = (begin + page - 1) / page * page;
  const uint64_t last = end / page * page;
  if (last > first) {
    ::madvise(const_cast<uint8_t*>(base_) + first, last - first, MADV_DONTNEED);
  }
}

namespace {

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exponent = (h >> 10) & 0x1f;
  uint32_t mantissa = h & 0x3ff;
  uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exponent = 127 - 15 + 1;
      while ((mantissa & 0x400) == 0) {
        mantissa <<= 1;
        --exponent;
      }
      mantissa &= 0x3ff;
      bits = sign | (exponent << 23) | (mantissa << 13);
    }
  } else if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else {
    bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  }
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

float BFloat16ToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

template <typename Target>
Status ConvertTo(DType from, const void* source, size_t count, Target* target) {
  auto each = [&](auto read) {
    for (size_t i = 0; i < count; ++i) target[i] = static_cast<Target>(read(i));
  };
  // Sources may sit at any offset of a mapped file: read them through memcpy.
  auto load = [source](size_t i, auto zero) {
    decltype(zero) value;
    std::memcpy(&value, static_cast<const uint8_t*>(source) + i * sizeof(value), sizeof(value));
    return value;
  };
  switch (from) {
    case DType::kF64: each([&](size_t i) { return load(i, double{}); }); break;
    case DType::kF32: each([&](size_t i) { return load(i, float{}); }); break;
    case DType::kF16: each([&](size_t i) { return HalfToFloat(load(i, uint16_t{})); }); break;
    case DType::kBF16: each([&](size_t i) { return BFloat16ToFloat(load(i, uint16_t{})); }); break;
    case DType::kI64: each([&](size_t i) { return load(i, int64_t{}); }); break;
    case DType::kI32: each([&](size_t i) { return load(i, int32_t{}); }); break;
    case DType::kI16: each([&](size_t i) { return load(i, int16_t{}); }); break;
    case DType::kI8: each([&](size_t i) { return load(i, int8_t{}); }); break;
    case DType::kU8: each([&](size_t i) { return load(i, uint8_t{}); }); break;
    case DType::kBool:
      return Status::InvalidArgument("cannot convert BOOL elements to floating point");
  }
  return Status::Ok();
}

}  // namespace

Status ConvertElements(DType from, const void* source, size_t count, DType to, void* target) {
  if (to == DType::kF32) return ConvertTo(from, source, count, static_cast<float*>(target));
  if (to == DType::kF64) return ConvertTo(from, source, count, static_cast<double*>(target));
  return Status::InvalidArgument(
      fmt::format("cannot convert to {}: the targets are F32 and F64", DTypeName(to)));
}

std::vector<std::string> SafetensorsIndex::Shards() const {
  std::set<std::string> files;
  for (const auto& [name, file] : weight_map) files.insert(file);
  return {files.begin(), files.end()};
}

Result<SafetensorsIndex> ReadSafetensorsIndex(const std::string& path) {
  std::string text;
  {
    uint64_t size = 0;
    STRIDER_ASSIGN_OR_RETURN(int fd, OpenForReading(path, &size));
    FileCloser closer(fd);
    if (size > kMaxHeaderBytes) {
      return Status::Corruption(fmt::format("{}: {} bytes, over the limit of {} for an index",
                                            path, size, kMaxHeaderBytes));
    }
    text.resize(size);
    STRIDER_RETURN_IF_ERROR(ReadAt(fd, 0, text.data(), size, path));
  }
  STRIDER_ASSIGN_OR_RETURN(Json json, ParseHeaderJson(text, path));
  if (!json.is_object() || !json.contains("weight_map") || !json["weight_map"].is_object()) {
    return Status::Corruption(
        fmt::format("{}: expected an object with a \"weight_map\" object", path));
  }
  SafetensorsIndex index;
  for (const auto& [name, file] : json["weight_map"].items()) {
    if (!file.is_string()) {
      return Status::Corruption(fmt::format("{}: weight_map entry '{}' is a JSON {}, expected "
                                            "a file name", path, name, file.type_name()));
    }
    const std::string shard = file.get<std::string>();
    if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..") {
      return Status::Corruption(fmt::format(
          "{}: weight_map entry '{}' names '{}', not a file beside the index", path, name, shard));
    }
    index.weight_map.emplace(name, shard);
  }
  if (json.contains("metadata")) {
    const Json& metadata = json["metadata"];
    if (!metadata.is_object()) {
      return Status::Corruption(fmt::format("{}: metadata is a JSON {}, expected an object", path,
                                            metadata.type_name()));
    }
    for (const char* key : {"total_size", "total_parameters"}) {
      if (!metadata.contains(key)) continue;
      // Some writers store the number as a string; both spell the same count.
      const Json& value = metadata[key];
      std::optional<uint64_t> number;
      if (value.is_string()) {
        const std::string digits = value.get<std::string>();
        if (!digits.empty() && digits.size() < 20 &&
            digits.find_first_not_of("0123456789") == std::string::npos) {
          number = std::stoull(digits);
        }
      } else {
        number = NonNegativeInteger(value, std::numeric_limits<uint64_t>::max());
      }
      if (!number) {
        return Status::Corruption(fmt::format("{}: metadata.{} is {}, expected a non-negative "
                                              "integer", path, key, value.dump()));
      }
      (std::string_view(key) == "total_size" ? index.total_size : index.total_parameters) =
          number;
    }
  }
  return index;
}

Status WriteSafetensorsIndex(const std::string& path, const SafetensorsIndex& index) {
  nlohmann::ordered_json json;
  json["metadata"] = nlohmann::ordered_json::object();
  if (index.total_parameters) json["metadata"]["total_parameters"] = *index.total_parameters;
  if (index.total_size) json["metadata"]["total_size"] = *index.total_size;
  json["weight_map"] = nlohmann::ordered_json::object();
  for (const auto& [name, file] : index.weight_map) json["weight_map"][name] = file;
  return WriteFileDurably(path, json.dump(2) + "\n");
}

Result<SafetensorsIndex> WriteShardedSafetensors(const std::string& directory,
                                                 const std::vector<TensorView>& tensors,
                                                 uint64_t max_shard_bytes,
                                                 const std::map<std::string, std::string>&
                                                     metadata) {
  std::vector<std::vector<TensorView>> shards(1);
  uint64_t in_shard = 0;
  uint64_t total_size = 0;
  uint64_t total_parameters = 0;
  std::set<std::string_view> names;
  for (const TensorView& view : tensors) {
    if (!names.insert(view.name).second) {
      return Status::InvalidArgument(
          fmt::format("{}: tensor '{}': duplicate tensor name", directory, view.name));
    }
    if (!shards.back().empty() && in_shard + view.byte_size > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(view);
    in_shard += view.byte_size;
    total_size += view.byte_size;
    std::optional<uint64_t> elements = ByteSizeOf(view.shape, 1);
    if (elements) total_parameters += *elements;
  }
  SafetensorsIndex index;
  index.total_size = total_size;
  index.total_parameters = total_parameters;
  const size_t n = shards.size();
  for (size_t i = 0; i < n; ++i) {
    const std::string file =
        n == 1 ? std::string("model.safetensors")
               : fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, n);
    STRIDER_RETURN_IF_ERROR(WriteSafetensors(directory + "/" + file, shards[i], metadata));
    for (const TensorView& view : shards[i]) index.weight_map[view.name] = file;
  }
  if (n > 1) {
    STRIDER_RETURN_IF_ERROR(
        WriteSafetensorsIndex(directory + "/" + kSafetensorsIndexName, index));
  }
  return index;
}

}  // namespace strider
