// The Jinja2 subset of chat templates (jinja.h): a lexer that applies Jinja's whitespace rules,
// a recursive-descent parser to a tree, and a tree-walking evaluator over Python-like values.
//
// The evaluator reports errors by throwing RenderError, caught in Template::Render: an error can
// arise at any depth of a template's expression tree, and unwinding to the one public entry point
// keeps every evaluation step a plain function of values. Nothing throws across the interface.
#include "common/tokenizer/jinja.h"

#include <unicode/unistr.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

namespace strider::tokenizer::jinja {
namespace {

// ------------------------------------------------------------------------------------------------
// Values

class Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;  // insertion order, as Python's dict
struct Args;
struct Interp;
using Function = std::function<Value(Interp&, Args&)>;

struct Callable {
  std::string name;
  Function fn;
};

class Value {
 public:
  enum class Kind {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kNamespace,
    kCallable
  };

  Value() = default;  // undefined
  static Value None() {
    Value v;
    v.kind_ = Kind::kNone;
    return v;
  }
  static Value Undefined(std::string hint = {}) {
    Value v;
    v.str_ = std::make_shared<std::string>(std::move(hint));
    return v;
  }
  Value(bool b) : kind_(Kind::kBool), int_(b) {}       // NOLINT
  Value(int64_t i) : kind_(Kind::kInt), int_(i) {}     // NOLINT
  Value(int i) : kind_(Kind::kInt), int_(i) {}         // NOLINT
  Value(double d) : kind_(Kind::kFloat), float_(d) {}  // NOLINT
  Value(std::string s)
      : kind_(Kind::kString), str_(std::make_shared<std::string>(std::move(s))) {}  // NOLINT
  Value(const char* s) : Value(std::string(s)) {}                                   // NOLINT
  static Value MakeList(List items, bool tuple = false) {
    Value v;
    v.kind_ = Kind::kList;
    v.list_ = std::make_shared<List>(std::move(items));
    v.tuple_ = tuple;
    return v;
  }
  static Value MakeDict(Dict items, bool ns = false) {
    Value v;
    v.kind_ = ns ? Kind::kNamespace : Kind::kDict;
    v.dict_ = std::make_shared<Dict>(std::move(items));
    return v;
  }
  static Value MakeCallable(std::string name, Function fn) {
    Value v;
    v.kind_ = Kind::kCallable;
    v.callable_ = std::make_shared<Callable>(Callable{std::move(name), std::move(fn)});
    return v;
  }

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_tuple() const { return kind_ == Kind::kList && tuple_; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const { return kind_ == Kind::kNamespace; }
  bool is_callable() const { return kind_ == Kind::kCallable; }

  int64_t as_int() const { return int_; }
  double as_float() const { return is_float() ? float_ : static_cast<double>(int_); }
  const std::string& str() const { return *str_; }
  const List& list() const { return *list_; }
  List& mutable_list() const { return *list_; }
  const Dict& dict() const { return *dict_; }
  Dict& mutable_dict() const { return *dict_; }
  const Callable& callable() const { return *callable_; }
  const std::string& undefined_hint() const {
    static const std::string kEmpty;
    return str_ ? *str_ : kEmpty;
  }

  const Value* Find(std::string_view key) const {
    for (const auto& [k, v] : *dict_) {
      if (k == key) return &v;
    }
    return nullptr;
  }
  void Set(const std::string& key, Value value) const {
    for (auto& [k, v] : *dict_) {
      if (k == key) {
        v = std::move(value);
        return;
      }
    }
    dict_->emplace_back(key, std::move(value));
  }

 private:
  Kind kind_ = Kind::kUndefined;
  int64_t int_ = 0;
  double float_ = 0;
  bool tuple_ = false;
  std::shared_ptr<std::string> str_;
  std::shared_ptr<List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<Callable> callable_;
};

struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

struct RenderError {
  std::string message;
};

[[noreturn]] void Fail(std::string message) { throw RenderError{std::move(message)}; }

// ------------------------------------------------------------------------------------------------
// UTF-8 and Python string helpers

std::vector<std::string_view> CodePoints(std::string_view s) {
  std::vector<std::string_view> out;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (i + n > s.size()) n = s.size() - i;
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

uint32_t DecodeOne(std::string_view cp) {
  const unsigned char c = static_cast<unsigned char>(cp[0]);
  if (cp.size() == 1) return c;
  uint32_t v = cp.size() == 2 ? (c & 0x1F) : cp.size() == 3 ? (c & 0x0F) : (c & 0x07);
  for (size_t i = 1; i < cp.size(); ++i) v = (v << 6) | (static_cast<unsigned char>(cp[i]) & 0x3F);
  return v;
}

void AppendUtf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Python's str.isspace().
bool IsPySpace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// str.strip/lstrip/rstrip: `chars` nullopt strips white space, else any of its code points.
std::string PyStrip(std::string_view s, const std::optional<std::string>& chars, bool left,
                    bool right) {
  const std::vector<std::string_view> cps = CodePoints(s);
  std::vector<uint32_t> set;
  if (chars) {
    for (std::string_view cp : CodePoints(*chars)) set.push_back(DecodeOne(cp));
  }
  const auto strip = [&](std::string_view cp) {
    const uint32_t c = DecodeOne(cp);
    return chars ? std::find(set.begin(), set.end(), c) != set.end() : IsPySpace(c);
  };
  size_t begin = 0, end = cps.size();
  if (left) {
    while (begin < end && strip(cps[begin])) ++begin;
  }
  if (right) {
    while (end > begin && strip(cps[end - 1])) --end;
  }
  std::string out;
  for (size_t i = begin; i < end; ++i) out += cps[i];
  return out;
}

std::string CaseMap(const std::string& s, bool upper) {
  icu::UnicodeString u = icu::UnicodeString::fromUTF8(s);
  if (upper) {
    u.toUpper();
  } else {
    u.toLower();
  }
  std::string out;
  u.toUTF8String(out);
  return out;
}

std::string Capitalize(const std::string& s, bool title);
std::string Replace(const std::string& s, const std::string& from, const std::string& to,
                    int64_t count);

// Python's repr() of a str: single quotes unless the text has a ' and no ".
std::string PyReprString(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (std::string_view cp : CodePoints(s)) {
    const uint32_t c = DecodeOne(cp);
    if (c == static_cast<uint32_t>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += cp;
    }
  }
  out += quote;
  return out;
}

// Python's repr() of a float (the shortest text that reads back as the same double).
std::string PyFloat(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, end);
  // sci: [-]D[.DDD]e[+-]XX
  const size_t e = sci.find('e');
  std::string mantissa = sci.substr(0, e);
  const int exponent = std::stoi(sci.substr(e + 1));
  bool negative = false;
  if (!mantissa.empty() && mantissa[0] == '-') {
    negative = true;
    mantissa.erase(0, 1);
  }
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits += c;
  }
  std::string out;
  if (exponent >= -5 && exponent < 16) {
    if (exponent < 0) {
      out = "0." + std::string(-exponent - 1, '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exponent + 1) {
      out = digits + std::string(exponent + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, exponent + 1) + "." + digits.substr(exponent + 1);
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char exp[16];
    std::snprintf(exp, sizeof(exp), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out += exp;
  }
  return negative ? "-" + out : out;
}

std::string TypeName(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "Undefined";
    case Value::Kind::kNone:
      return "NoneType";
    case Value::Kind::kBool:
      return "bool";
    case Value::Kind::kInt:
      return "int";
    case Value::Kind::kFloat:
      return "float";
    case Value::Kind::kString:
      return "str";
    case Value::Kind::kList:
      return v.is_tuple() ? "tuple" : "list";
    case Value::Kind::kDict:
      return "dict";
    case Value::Kind::kNamespace:
      return "Namespace";
    case Value::Kind::kCallable:
      return "function";
  }
  return "object";
}

std::string Repr(const Value& v);

// Python's str().
std::string Str(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kBool:
      return v.as_int() ? "True" : "False";
    case Value::Kind::kInt:
      return std::to_string(v.as_int());
    case Value::Kind::kFloat:
      return PyFloat(v.as_float());
    case Value::Kind::kString:
      return v.str();
    case Value::Kind::kNamespace:
      return "<Namespace " + Repr(Value::MakeDict(v.dict())) + ">";
    case Value::Kind::kCallable:
      return "<function " + v.callable().name + ">";
    default:
      return Repr(v);
  }
}

std::string Repr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kString:
      return PyReprString(v.str());
    case Value::Kind::kList: {
      std::string out = v.is_tuple() ? "(" : "[";
      for (size_t i = 0; i < v.list().size(); ++i) {
        if (i > 0) out += ", ";
        out += Repr(v.list()[i]);
      }
      if (v.is_tuple() && v.list().size() == 1) out += ",";
      return out + (v.is_tuple() ? ")" : "]");
    }
    case Value::Kind::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, item] : v.dict()) {
        if (!first) out += ", ";
        first = false;
        out += PyReprString(k) + ": " + Repr(item);
      }
      return out + "}";
    }
    default:
      return Str(v);
  }
}

bool Truthy(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return false;
    case Value::Kind::kBool:
    case Value::Kind::kInt:
      return v.as_int() != 0;
    case Value::Kind::kFloat:
      return v.as_float() != 0;
    case Value::Kind::kString:
      return !v.str().empty();
    case Value::Kind::kList:
      return !v.list().empty();
    case Value::Kind::kDict:
      return !v.dict().empty();
    default:
      return true;
  }
}

bool Equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_float() == b.as_float();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.str() == b.str();
    case Value::Kind::kList:
      if (a.list().size() != b.list().size() || a.is_tuple() != b.is_tuple()) return false;
      for (size_t i = 0; i < a.list().size(); ++i) {
        if (!Equal(a.list()[i], b.list()[i])) return false;
      }
      return true;
    case Value::Kind::kDict:
      if (a.dict().size() != b.dict().size()) return false;
      for (const auto& [k, item] : a.dict()) {
        const Value* other = b.Find(k);
        if (other == nullptr || !Equal(item, *other)) return false;
      }
      return true;
    default:
      return false;
  }
}

// -1, 0, 1 as Python's < would order them; a TypeError where Python raises one.
int Compare(const Value& a, const Value& b, std::string_view op) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      return a.as_float() < b.as_float() ? -1 : a.as_float() > b.as_float() ? 1 : 0;
    }
    return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int() ? 1 : 0;
  }
  if (a.is_string() && b.is_string())
    return a.str().compare(b.str()) < 0 ? -1 : a.str() == b.str() ? 0 : 1;
  if (a.is_list() && b.is_list()) {
    const size_t n = std::min(a.list().size(), b.list().size());
    for (size_t i = 0; i < n; ++i) {
      if (!Equal(a.list()[i], b.list()[i])) return Compare(a.list()[i], b.list()[i], op);
    }
    return a.list().size() < b.list().size() ? -1 : a.list().size() > b.list().size() ? 1 : 0;
  }
  Fail("'" + std::string(op) + "' not supported between instances of '" + TypeName(a) + "' and '" +
       TypeName(b) + "'");
}

size_t Length(const Value& v) {
  if (v.is_string()) return CodePoints(v.str()).size();
  if (v.is_list()) return v.list().size();
  if (v.is_dict() || v.is_namespace()) return v.dict().size();
  if (v.is_undefined()) return 0;
  Fail("object of type '" + TypeName(v) + "' has no len()");
}

// The items a for loop, `in`, join, ... see: list items, dict keys, string characters.
List Iterate(const Value& v) {
  if (v.is_list()) return v.list();
  if (v.is_dict()) {
    List keys;
    for (const auto& [k, item] : v.dict()) keys.emplace_back(k);
    return keys;
  }
  if (v.is_string()) {
    List chars;
    for (std::string_view cp : CodePoints(v.str())) chars.emplace_back(std::string(cp));
    return chars;
  }
  if (v.is_undefined()) return {};
  Fail("'" + TypeName(v) + "' object is not iterable");
}

bool Contains(const Value& container, const Value& item) {
  if (container.is_string()) {
    if (!item.is_string()) {
      Fail("'in <string>' requires string as left operand, not " + TypeName(item));
    }
    return container.str().find(item.str()) != std::string::npos;
  }
  if (container.is_dict()) return item.is_string() && container.Find(item.str()) != nullptr;
  if (container.is_undefined()) {
    Fail(container.undefined_hint().empty() ? "value is undefined" : container.undefined_hint());
  }
  for (const Value& v : Iterate(container)) {
    if (Equal(v, item)) return true;
  }
  return false;
}

// json.dumps(value, ensure_ascii, indent, separators, sort_keys) as transformers' tojson calls it.
struct JsonStyle {
  bool ensure_ascii = false;
  int indent = -1;  // -1: none
  std::string item_separator;
  std::string key_separator;
  bool sort_keys = false;
};

void JsonString(const std::string& s, bool ensure_ascii, std::string& out) {
  out += '"';
  for (std::string_view cp : CodePoints(s)) {
    const uint32_t c = DecodeOne(cp);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default: {
        char buf[16];
        if (c < 0x20 || (ensure_ascii && c >= 0x7F)) {
          if (c >= 0x10000) {
            const uint32_t v = c - 0x10000;
            std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", 0xD800 + (v >> 10),
                          0xDC00 + (v & 0x3FF));
          } else {
            std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          }
          out += buf;
        } else {
          out += cp;
        }
      }
    }
  }
  out += '"';
}

void Json(const Value& v, const JsonStyle& style, int depth, std::string& out) {
  const auto newline = [&](int level) {
    if (style.indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(style.indent * level), ' ');
  };
  switch (v.kind()) {
    case Value::Kind::kNone:
      out += "null";
      return;
    case Value::Kind::kBool:
      out += v.as_int() ? "true" : "false";
      return;
    case Value::Kind::kInt:
      out += std::to_string(v.as_int());
      return;
    case Value::Kind::kFloat: {
      const double d = v.as_float();
      if (std::isnan(d)) {
        out += "NaN";
      } else if (std::isinf(d)) {
        out += d > 0 ? "Infinity" : "-Infinity";
      } else {
        out += PyFloat(d);
      }
      return;
    }
    case Value::Kind::kString:
      JsonString(v.str(), style.ensure_ascii, out);
      return;
    case Value::Kind::kList: {
      if (v.list().empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < v.list().size(); ++i) {
        if (i > 0) out += style.item_separator;
        newline(depth + 1);
        Json(v.list()[i], style, depth + 1, out);
      }
      newline(depth);
      out += ']';
      return;
    }
    case Value::Kind::kDict: {
      if (v.dict().empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& item : v.dict()) items.push_back(&item);
      if (style.sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](const auto* a, const auto* b) { return a->first < b->first; });
      }
      out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += style.item_separator;
        newline(depth + 1);
        JsonString(items[i]->first, style.ensure_ascii, out);
        out += style.key_separator;
        Json(items[i]->second, style, depth + 1, out);
      }
      newline(depth);
      out += '}';
      return;
    }
    default:
      Fail("Object of type " + TypeName(v) + " is not JSON serializable");
  }
}

Value FromJson(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::None();
    case nlohmann::ordered_json::value_t::boolean:
      return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Value(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float:
      return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      for (const auto& item : j) items.push_back(FromJson(item));
      return Value::MakeList(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict items;
      for (const auto& [k, item] : j.items()) items.emplace_back(k, FromJson(item));
      return Value::MakeDict(std::move(items));
    }
    default:
      return Value::None();
  }
}

// ------------------------------------------------------------------------------------------------
// Lexer

struct Pos {
  int line = 1;
  int column = 1;
};

std::string At(const Pos& pos) {
  return "line " + std::to_string(pos.line) + ", column " + std::to_string(pos.column);
}

struct ParseError {
  Pos pos;
  std::string message;
};

enum class Tok { kName, kInt, kFloat, kString, kOp, kEnd };

struct Token {
  Tok type = Tok::kEnd;
  std::string text;  // name, operator, or the decoded string literal
  int64_t int_value = 0;
  double float_value = 0;
  Pos pos;
};

enum class SegmentKind { kText, kExpr, kStmt };

struct Segment {
  SegmentKind kind;
  std::string text;           // kText
  std::vector<Token> tokens;  // kExpr / kStmt, ending with kEnd
  Pos pos;
};

class Lexer {
 public:
  explicit Lexer(std::string source) : src_(std::move(source)) {}

  std::vector<Segment> Run() {
    std::vector<Segment> out;
    bool line_starting = true;
    size_t pos = 0;
    while (pos < src_.size()) {
      size_t open = std::string::npos;
      for (size_t i = src_.find('{', pos); i != std::string::npos; i = src_.find('{', i + 1)) {
        if (i + 1 < src_.size() &&
            (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
          open = i;
          break;
        }
      }
      std::string text =
          src_.substr(pos, open == std::string::npos ? std::string::npos : open - pos);
      if (open == std::string::npos) {
        if (!text.empty()) out.push_back({SegmentKind::kText, text, {}, PosOf(pos)});
        break;
      }
      const char kind = src_[open + 1];
      size_t inner = open + 2;
      char sign = 0;
      if (inner < src_.size() && (src_[inner] == '-' || src_[inner] == '+')) sign = src_[inner++];
      if (sign == '-') {
        size_t end = text.size();
        while (end > 0 && IsSpaceByte(text[end - 1])) --end;
        text.resize(end);
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: white space from the start of the line to a block or comment tag.
        const size_t line_start = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        if (line_start > 0 || line_starting) {
          bool blank = line_start < text.size();
          for (size_t i = line_start; i < text.size(); ++i) {
            if (!IsSpaceByte(text[i])) blank = false;
          }
          if (blank) text.resize(line_start);
        }
      }
      if (!text.empty()) out.push_back({SegmentKind::kText, text, {}, PosOf(pos)});
      if (kind == '#') {
        const size_t close = src_.find("#}", inner);
        if (close == std::string::npos) throw ParseError{PosOf(open), "unterminated comment"};
        pos = close + 2;
        const char end_sign = close > inner ? src_[close - 1] : 0;
        pos = AfterTag(pos, end_sign, /*block=*/true);
      } else {
        Segment segment{kind == '{' ? SegmentKind::kExpr : SegmentKind::kStmt, {}, {}, PosOf(open)};
        size_t end_sign_pos = 0;
        pos = TokenizeTag(inner, kind == '{' ? '}' : '%', segment.tokens, end_sign_pos);
        const char end_sign = end_sign_pos ? src_[end_sign_pos] : 0;
        pos = AfterTag(pos, end_sign, kind == '%');
        if (kind == '%' && !segment.tokens.empty() && segment.tokens[0].type == Tok::kName &&
            segment.tokens[0].text == "raw") {
          throw ParseError{segment.tokens[0].pos, "unsupported construct 'raw'"};
        }
        out.push_back(std::move(segment));
      }
      line_starting = pos > 0 && src_[pos - 1] == '\n';
    }
    return out;
  }

 private:
  static bool IsSpaceByte(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
  }

  // After a tag's closing delimiter: "-" eats all white space, trim_blocks one newline after a
  // block or comment tag unless "+" was written.
  size_t AfterTag(size_t pos, char end_sign, bool block) {
    if (end_sign == '-') {
      while (pos < src_.size() && IsSpaceByte(src_[pos])) ++pos;
    } else if (block && end_sign != '+' && pos < src_.size() && src_[pos] == '\n') {
      ++pos;
    }
    return pos;
  }

  Pos PosOf(size_t offset) {
    // Positions are asked for in increasing order, so a running count suffices.
    while (line_offset_ < offset) {
      if (src_[line_offset_] == '\n') {
        ++line_.line;
        line_.column = 1;
      } else if ((static_cast<unsigned char>(src_[line_offset_]) & 0xC0) != 0x80) {
        ++line_.column;
      }
      ++line_offset_;
    }
    if (offset < line_offset_) return RecountPos(offset);
    return line_;
  }

  Pos RecountPos(size_t offset) const {
    Pos p;
    for (size_t i = 0; i < offset && i < src_.size(); ++i) {
      if (src_[i] == '\n') {
        ++p.line;
        p.column = 1;
      } else if ((static_cast<unsigned char>(src_[i]) & 0xC0) != 0x80) {
        ++p.column;
      }
    }
    return p;
  }

  // Tokens from `pos` up to the tag's end ("}}" or "%}", optionally signed); returns the offset
  // past the end delimiter and sets `end_sign_pos` to the sign's offset (0 if none).
  size_t TokenizeTag(size_t pos, char closer, std::vector<Token>& tokens, size_t& end_sign_pos) {
    const auto closes_at = [&](size_t p) -> size_t {  // length of the end delimiter at p, or 0
      if ((src_[p] == '-' || src_[p] == '+') && p + 2 < src_.size() + 0 && src_[p + 1] == closer &&
          src_[p + 2] == '}') {
        if (src_[p] == '+' && closer == '}') return 0;
        return 3;
      }
      if (p + 1 < src_.size() && src_[p] == closer && src_[p + 1] == '}') return 2;
      return 0;
    };
    while (true) {
      while (pos < src_.size() && IsSpaceByte(src_[pos])) ++pos;
      if (pos >= src_.size()) {
        throw ParseError{PosOf(pos),
                         std::string("unexpected end of template, expected '") + closer + "}'"};
      }
      if (const size_t n = closes_at(pos)) {
        end_sign_pos = n == 3 ? pos : 0;
        Token end;
        end.type = Tok::kEnd;
        end.pos = PosOf(pos);
        tokens.push_back(end);
        return pos + n;
      }
      tokens.push_back(NextToken(pos));
    }
  }

  Token NextToken(size_t& pos) {
    Token t;
    t.pos = PosOf(pos);
    const char c = src_[pos];
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t end = pos;
      while (end < src_.size() &&
             (std::isalnum(static_cast<unsigned char>(src_[end])) || src_[end] == '_')) {
        ++end;
      }
      t.type = Tok::kName;
      t.text = src_.substr(pos, end - pos);
      pos = end;
      return t;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t end = pos;
      const auto digits = [&]() {
        while (end < src_.size() &&
               (std::isdigit(static_cast<unsigned char>(src_[end])) || src_[end] == '_')) {
          ++end;
        }
      };
      digits();
      bool is_float = false;
      if (end + 1 < src_.size() && src_[end] == '.' &&
          std::isdigit(static_cast<unsigned char>(src_[end + 1]))) {
        is_float = true;
        ++end;
        digits();
      }
      if (end < src_.size() && (src_[end] == 'e' || src_[end] == 'E')) {
        size_t e = end + 1;
        if (e < src_.size() && (src_[e] == '+' || src_[e] == '-')) ++e;
        if (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) {
          is_float = true;
          end = e;
          digits();
        }
      }
      std::string text;
      for (size_t i = pos; i < end; ++i) {
        if (src_[i] != '_') text += src_[i];
      }
      pos = end;
      if (is_float) {
        t.type = Tok::kFloat;
        t.float_value = std::strtod(text.c_str(), nullptr);
      } else {
        t.type = Tok::kInt;
        t.int_value = std::strtoll(text.c_str(), nullptr, 10);
      }
      return t;
    }
    if (c == '\'' || c == '"') {
      std::string value;
      size_t p = pos + 1;
      while (true) {
        if (p >= src_.size()) throw ParseError{t.pos, "unterminated string literal"};
        const char ch = src_[p];
        if (ch == c) break;
        if (ch == '\\' && p + 1 < src_.size()) {
          const char esc = src_[p + 1];
          p += 2;
          switch (esc) {
            case 'n':
              value += '\n';
              break;
            case 't':
              value += '\t';
              break;
            case 'r':
              value += '\r';
              break;
            case '\\':
              value += '\\';
              break;
            case '\'':
              value += '\'';
              break;
            case '"':
              value += '"';
              break;
            case 'a':
              value += '\a';
              break;
            case 'b':
              value += '\b';
              break;
            case 'f':
              value += '\f';
              break;
            case 'v':
              value += '\v';
              break;
            case '\n':
              break;
            case 'x':
            case 'u':
            case 'U': {
              const size_t n = esc == 'x' ? 2 : esc == 'u' ? 4 : 8;
              if (p + n > src_.size())
                throw ParseError{t.pos, "truncated \\" + std::string(1, esc) + " escape"};
              const std::string hex = src_.substr(p, n);
              char* end = nullptr;
              const unsigned long cp = std::strtoul(hex.c_str(), &end, 16);
              if (end != hex.c_str() + n) {
                throw ParseError{t.pos, "malformed \\" + std::string(1, esc) + " escape"};
              }
              AppendUtf8(value, static_cast<uint32_t>(cp));
              p += n;
              break;
            }
            default:
              if (esc >= '0' && esc <= '7') {
                uint32_t cp = esc - '0';
                for (int k = 0; k < 2 && p < src_.size() && src_[p] >= '0' && src_[p] <= '7'; ++k) {
                  cp = cp * 8 + (src_[p++] - '0');
                }
                AppendUtf8(value, cp);
              } else {
                value += '\\';
                value += esc;
              }
          }
          continue;
        }
        value += ch;
        ++p;
      }
      pos = p + 1;
      t.type = Tok::kString;
      t.text = std::move(value);
      return t;
    }
    static const char* const kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                       "/",  "%",  "~",  "(",  ")",  "[",  "]", "{", "}",
                                       ",",  ".",  ":",  "|",  "=",  "<",  ">"};
    for (const char* op : kOps) {
      const size_t n = std::char_traits<char>::length(op);
      if (src_.compare(pos, n, op) == 0) {
        t.type = Tok::kOp;
        t.text = op;
        pos += n;
        return t;
      }
    }
    throw ParseError{t.pos, std::string("unexpected character '") + c + "'"};
  }

  std::string src_;
  size_t line_offset_ = 0;
  Pos line_;
};

// ------------------------------------------------------------------------------------------------
// Syntax tree

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,
    kName,
    kAttr,
    kItem,
    kSlice,
    kCall,
    kFilter,
    kTest,
    kNeg,
    kPos,
    kNot,
    kAnd,
    kOr,
    kBinary,
    kCompare,
    kConcat,
    kCond,
    kList,
    kTuple,
    kDict
  };
  Kind kind;
  Pos pos;
  Value literal;
  std::string name;               // name, attribute, filter, test, binary operator
  std::vector<ExprPtr> children;  // operands, list items, dict keys and values, call args
  std::vector<std::string> ops;   // comparison operators
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  bool negated = false;                 // `is not`
  bool has[3] = {false, false, false};  // which slice parts were written
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct Node {
  enum class Kind {
    kText,
    kOutput,
    kIf,
    kFor,
    kSet,
    kSetBlock,
    kMacro,
    kBreak,
    kContinue,
    kGeneration
  };
  Kind kind;
  Pos pos;
  std::string text;                                     // kText
  ExprPtr expr;                                         // kOutput, kSet value, kFor iterable
  std::vector<std::pair<ExprPtr, Body>> branches;       // kIf
  Body body;                                            // kFor, kSetBlock, kMacro, kGeneration
  Body else_body;                                       // kIf, kFor
  std::vector<std::string> targets;                     // kFor loop variables, kSet names
  std::string attr;                                     // kSet of `ns.attr`
  ExprPtr filter;                                       // kFor inline if
  std::vector<std::pair<std::string, ExprPtr>> params;  // kMacro (default may be null)
  std::string name;                                     // kMacro
  std::vector<std::pair<std::string, std::vector<ExprPtr>>> block_filters;  // kSetBlock
};

}  // namespace

struct Program {
  Body body;
};

namespace {

// ------------------------------------------------------------------------------------------------
// Parser

class Parser {
 public:
  explicit Parser(std::vector<Segment> segments) : segments_(std::move(segments)) {}

  Body ParseTemplate() {
    Body body = ParseBody({});
    if (seg_ < segments_.size()) {
      throw ParseError{segments_[seg_].tokens[0].pos,
                       "unexpected '" + segments_[seg_].tokens[0].text + "'"};
    }
    return body;
  }

 private:
  // Statements until a block tag whose keyword is in `ends` (left unconsumed) or the end.
  Body ParseBody(const std::vector<std::string>& ends) {
    Body body;
    while (seg_ < segments_.size()) {
      Segment& s = segments_[seg_];
      if (s.kind == SegmentKind::kText) {
        auto node = std::make_unique<Node>();
        node->kind = Node::Kind::kText;
        node->text = s.text;
        node->pos = s.pos;
        body.push_back(std::move(node));
        ++seg_;
        continue;
      }
      toks_ = &s.tokens;
      tok_ = 0;
      if (s.kind == SegmentKind::kExpr) {
        auto node = std::make_unique<Node>();
        node->kind = Node::Kind::kOutput;
        node->pos = s.pos;
        node->expr = ParseExpression();
        ExpectEnd();
        body.push_back(std::move(node));
        ++seg_;
        continue;
      }
      const Token& keyword = Peek();
      if (keyword.type != Tok::kName) throw ParseError{keyword.pos, "expected a statement keyword"};
      if (std::find(ends.begin(), ends.end(), keyword.text) != ends.end()) return body;
      body.push_back(ParseStatement());
    }
    if (!ends.empty()) {
      const auto& [pos, keyword] = open_.back();
      throw ParseError{
          pos, "'" + keyword + "' is never closed: the template ends before '" + ends.back() + "'"};
    }
    return body;
  }

  // At a block tag whose keyword is next: consumes the keyword and returns it.
  std::string EnterTag() {
    toks_ = &segments_[seg_].tokens;
    tok_ = 0;
    return Next().text;
  }

  void CloseTag() {
    ExpectEnd();
    ++seg_;
  }

  NodePtr ParseStatement() {
    const Token keyword = Next();
    const std::string& k = keyword.text;
    auto node = std::make_unique<Node>();
    node->pos = keyword.pos;
    // The innermost block being parsed, for the error when its end tag never comes.
    open_.emplace_back(keyword.pos, k);
    struct Pop {
      std::vector<std::pair<Pos, std::string>>& open;
      ~Pop() { open.pop_back(); }
    } pop{open_};
    if (k == "if") {
      node->kind = Node::Kind::kIf;
      ExprPtr cond = ParseExpression();
      CloseTag();
      while (true) {
        Body branch = ParseBody({"elif", "else", "endif"});
        node->branches.emplace_back(std::move(cond), std::move(branch));
        const std::string tag = EnterTag();
        if (tag == "elif") {
          cond = ParseExpression();
          CloseTag();
          continue;
        }
        if (tag == "else") {
          CloseTag();
          node->else_body = ParseBody({"endif"});
          EnterTag();
        }
        CloseTag();
        return node;
      }
    }
    if (k == "for") {
      node->kind = Node::Kind::kFor;
      do {
        const Token name = Next();
        if (name.type != Tok::kName) throw ParseError{name.pos, "expected a loop variable name"};
        node->targets.push_back(name.text);
      } while (AcceptOp(","));
      const Token in = Next();
      if (in.type != Tok::kName || in.text != "in") throw ParseError{in.pos, "expected 'in'"};
      node->expr = ParseExpression(/*allow_cond=*/false);
      if (AcceptName("if")) node->filter = ParseExpression();
      if (AcceptName("recursive")) {
        throw ParseError{toks_->at(tok_ - 1).pos, "unsupported construct 'recursive' loop"};
      }
      CloseTag();
      node->body = ParseBody({"else", "endfor"});
      if (EnterTag() == "else") {
        CloseTag();
        node->else_body = ParseBody({"endfor"});
        EnterTag();
      }
      CloseTag();
      return node;
    }
    if (k == "set") {
      const Token name = Next();
      if (name.type != Tok::kName) throw ParseError{name.pos, "expected a name after 'set'"};
      node->targets.push_back(name.text);
      if (AcceptOp(".")) {
        const Token attr = Next();
        if (attr.type != Tok::kName) throw ParseError{attr.pos, "expected an attribute name"};
        node->attr = attr.text;
      } else {
        while (AcceptOp(",")) {
          const Token more = Next();
          if (more.type != Tok::kName) throw ParseError{more.pos, "expected a name"};
          node->targets.push_back(more.text);
        }
      }
      if (AcceptOp("=")) {
        node->kind = Node::Kind::kSet;
        node->expr = ParseTupleOrExpression();
        CloseTag();
        return node;
      }
      if (!node->attr.empty() || node->targets.size() != 1) {
        throw ParseError{Peek().pos, "expected '='"};
      }
      node->kind = Node::Kind::kSetBlock;
      while (AcceptOp("|")) {
        const Token f = Next();
        if (f.type != Tok::kName) throw ParseError{f.pos, "expected a filter name"};
        std::vector<ExprPtr> args;
        if (AcceptOp("(")) {
          if (!AcceptOp(")")) {
            do args.push_back(ParseExpression());
            while (AcceptOp(","));
            ExpectOp(")");
          }
        }
        node->block_filters.emplace_back(f.text, std::move(args));
      }
      CloseTag();
      node->body = ParseBody({"endset"});
      EnterTag();
      CloseTag();
      return node;
    }
    if (k == "macro") {
      node->kind = Node::Kind::kMacro;
      const Token name = Next();
      if (name.type != Tok::kName) throw ParseError{name.pos, "expected a macro name"};
      node->name = name.text;
      ExpectOp("(");
      if (!AcceptOp(")")) {
        do {
          const Token p = Next();
          if (p.type != Tok::kName) throw ParseError{p.pos, "expected a parameter name"};
          ExprPtr def;
          if (AcceptOp("=")) def = ParseExpression();
          node->params.emplace_back(p.text, std::move(def));
        } while (AcceptOp(","));
        ExpectOp(")");
      }
      CloseTag();
      node->body = ParseBody({"endmacro"});
      EnterTag();
      CloseTag();
      return node;
    }
    if (k == "break" || k == "continue") {
      node->kind = k == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
      CloseTag();
      return node;
    }
    if (k == "generation") {
      node->kind = Node::Kind::kGeneration;
      CloseTag();
      node->body = ParseBody({"endgeneration"});
      EnterTag();
      CloseTag();
      return node;
    }
    static const char* const kKnown[] = {"include",    "import", "from",   "extends",
                                         "block",      "call",   "filter", "with",
                                         "autoescape", "do",     "trans",  "raw"};
    for (const char* known : kKnown) {
      if (k == known) throw ParseError{keyword.pos, "unsupported construct '" + k + "'"};
    }
    if (k.starts_with("end") || k == "else" || k == "elif") {
      throw ParseError{keyword.pos, "unexpected '" + k + "': no block is open here"};
    }
    throw ParseError{keyword.pos, "unknown statement '" + k + "'"};
  }

  // ---- tokens

  const Token& Peek(size_t ahead = 0) const {
    const size_t i = std::min(tok_ + ahead, toks_->size() - 1);
    return (*toks_)[i];
  }
  Token Next() {
    const Token& t = Peek();
    if (t.type == Tok::kEnd) throw ParseError{t.pos, "unexpected end of tag"};
    ++tok_;
    return t;
  }
  bool IsOp(const char* op, size_t ahead = 0) const {
    return Peek(ahead).type == Tok::kOp && Peek(ahead).text == op;
  }
  bool IsName(const char* name, size_t ahead = 0) const {
    return Peek(ahead).type == Tok::kName && Peek(ahead).text == name;
  }
  bool AcceptOp(const char* op) {
    if (!IsOp(op)) return false;
    ++tok_;
    return true;
  }
  bool AcceptName(const char* name) {
    if (!IsName(name)) return false;
    ++tok_;
    return true;
  }
  void ExpectOp(const char* op) {
    if (!AcceptOp(op)) {
      throw ParseError{Peek().pos, std::string("expected '") + op + "', got " + Describe(Peek())};
    }
  }
  void ExpectEnd() {
    if (Peek().type != Tok::kEnd) {
      throw ParseError{Peek().pos, "expected the end of the tag, got " + Describe(Peek())};
    }
  }
  static std::string Describe(const Token& t) {
    switch (t.type) {
      case Tok::kEnd:
        return "the end of the tag";
      case Tok::kString:
        return "a string";
      case Tok::kInt:
      case Tok::kFloat:
        return "a number";
      default:
        return "'" + t.text + "'";
    }
  }

  ExprPtr Make(Expr::Kind kind, Pos pos) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->pos = pos;
    return e;
  }

  // ---- expressions, lowest precedence first (Jinja's parser.py)

  ExprPtr ParseTupleOrExpression() {
    const Pos pos = Peek().pos;
    ExprPtr first = ParseExpression();
    if (!IsOp(",")) return first;
    auto tuple = Make(Expr::Kind::kTuple, pos);
    tuple->children.push_back(std::move(first));
    while (AcceptOp(",")) {
      if (Peek().type == Tok::kEnd) break;
      tuple->children.push_back(ParseExpression());
    }
    return tuple;
  }

  ExprPtr ParseExpression(bool allow_cond = true) {
    ExprPtr e = ParseOr();
    while (allow_cond && IsName("if")) {
      const Pos pos = Next().pos;
      auto cond = Make(Expr::Kind::kCond, pos);
      ExprPtr test = ParseOr();
      ExprPtr otherwise;
      if (AcceptName("else")) otherwise = ParseExpression();
      cond->children.push_back(std::move(test));
      cond->children.push_back(std::move(e));
      cond->children.push_back(std::move(otherwise));
      e = std::move(cond);
    }
    return e;
  }

  ExprPtr ParseOr() {
    ExprPtr left = ParseAnd();
    while (IsName("or")) {
      auto e = Make(Expr::Kind::kOr, Next().pos);
      e->children.push_back(std::move(left));
      e->children.push_back(ParseAnd());
      left = std::move(e);
    }
    return left;
  }

  ExprPtr ParseAnd() {
    ExprPtr left = ParseNot();
    while (IsName("and")) {
      auto e = Make(Expr::Kind::kAnd, Next().pos);
      e->children.push_back(std::move(left));
      e->children.push_back(ParseNot());
      left = std::move(e);
    }
    return left;
  }

  ExprPtr ParseNot() {
    if (IsName("not")) {
      auto e = Make(Expr::Kind::kNot, Next().pos);
      e->children.push_back(ParseNot());
      return e;
    }
    return ParseCompare();
  }

  ExprPtr ParseCompare() {
    const Pos pos = Peek().pos;
    ExprPtr first = ParseMath1();
    std::unique_ptr<Expr> cmp;
    while (true) {
      std::string op;
      if (Peek().type == Tok::kOp &&
          (Peek().text == "==" || Peek().text == "!=" || Peek().text == "<" ||
           Peek().text == "<=" || Peek().text == ">" || Peek().text == ">=")) {
        op = Next().text;
      } else if (IsName("in")) {
        Next();
        op = "in";
      } else if (IsName("not") && IsName("in", 1)) {
        Next();
        Next();
        op = "notin";
      } else {
        break;
      }
      if (!cmp) {
        cmp = Make(Expr::Kind::kCompare, pos);
        cmp->children.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->children.push_back(ParseMath1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }

  ExprPtr Binary(std::string op, Pos pos, ExprPtr left, ExprPtr right) {
    auto e = Make(Expr::Kind::kBinary, pos);
    e->name = std::move(op);
    e->children.push_back(std::move(left));
    e->children.push_back(std::move(right));
    return e;
  }

  ExprPtr ParseMath1() {
    ExprPtr left = ParseConcat();
    while (IsOp("+") || IsOp("-")) {
      const Token op = Next();
      left = Binary(op.text, op.pos, std::move(left), ParseConcat());
    }
    return left;
  }

  ExprPtr ParseConcat() {
    const Pos pos = Peek().pos;
    ExprPtr first = ParseMath2();
    if (!IsOp("~")) return first;
    auto e = Make(Expr::Kind::kConcat, pos);
    e->children.push_back(std::move(first));
    while (AcceptOp("~")) e->children.push_back(ParseMath2());
    return e;
  }

  ExprPtr ParseMath2() {
    ExprPtr left = ParsePow();
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const Token op = Next();
      left = Binary(op.text, op.pos, std::move(left), ParsePow());
    }
    return left;
  }

  ExprPtr ParsePow() {
    ExprPtr left = ParseUnary();
    while (IsOp("**")) {
      const Token op = Next();
      left = Binary(op.text, op.pos, std::move(left), ParseUnary());
    }
    return left;
  }

  ExprPtr ParseUnary(bool with_filter = true) {
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      const Token op = Next();
      node = Make(op.text == "-" ? Expr::Kind::kNeg : Expr::Kind::kPos, op.pos);
      node->children.push_back(ParseUnary(false));
    } else {
      node = ParsePrimary();
    }
    node = ParsePostfix(std::move(node));
    if (with_filter) node = ParseFilterExpr(std::move(node));
    return node;
  }

  ExprPtr ParsePrimary() {
    const Token t = Next();
    switch (t.type) {
      case Tok::kName: {
        if (t.text == "true" || t.text == "True") return Literal(Value(true), t.pos);
        if (t.text == "false" || t.text == "False") return Literal(Value(false), t.pos);
        if (t.text == "none" || t.text == "None") return Literal(Value::None(), t.pos);
        auto e = Make(Expr::Kind::kName, t.pos);
        e->name = t.text;
        return e;
      }
      case Tok::kString: {
        std::string s = t.text;
        while (Peek().type == Tok::kString) s += Next().text;
        return Literal(Value(std::move(s)), t.pos);
      }
      case Tok::kInt:
        return Literal(Value(t.int_value), t.pos);
      case Tok::kFloat:
        return Literal(Value(t.float_value), t.pos);
      case Tok::kOp:
        if (t.text == "(") {
          if (AcceptOp(")")) return Make(Expr::Kind::kTuple, t.pos);
          ExprPtr first = ParseExpression();
          if (AcceptOp(")")) return first;
          auto tuple = Make(Expr::Kind::kTuple, t.pos);
          tuple->children.push_back(std::move(first));
          while (AcceptOp(",")) {
            if (IsOp(")")) break;
            tuple->children.push_back(ParseExpression());
          }
          ExpectOp(")");
          return tuple;
        }
        if (t.text == "[") {
          auto list = Make(Expr::Kind::kList, t.pos);
          while (!AcceptOp("]")) {
            if (!list->children.empty()) ExpectOp(",");
            if (AcceptOp("]")) break;
            list->children.push_back(ParseExpression());
          }
          return list;
        }
        if (t.text == "{") {
          auto dict = Make(Expr::Kind::kDict, t.pos);
          while (!AcceptOp("}")) {
            if (!dict->children.empty()) ExpectOp(",");
            if (AcceptOp("}")) break;
            dict->children.push_back(ParseExpression());
            ExpectOp(":");
            dict->children.push_back(ParseExpression());
          }
          return dict;
        }
        break;
      default:
        break;
    }
    throw ParseError{t.pos, "unexpected " + Describe(t)};
  }

  ExprPtr Literal(Value v, Pos pos) {
    auto e = Make(Expr::Kind::kLiteral, pos);
    e->literal = std::move(v);
    return e;
  }

  void ParseCallArgs(Expr& call) {
    // After "(": positional and keyword arguments, then ")".
    while (!AcceptOp(")")) {
      if (!call.children.empty() || !call.kwargs.empty()) {
        ExpectOp(",");
        if (AcceptOp(")")) break;
      }
      if (Peek().type == Tok::kName && IsOp("=", 1)) {
        const std::string key = Next().text;
        Next();
        call.kwargs.emplace_back(key, ParseExpression());
      } else {
        if (!call.kwargs.empty()) {
          throw ParseError{Peek().pos, "positional argument follows keyword argument"};
        }
        call.children.push_back(ParseExpression());
      }
    }
  }

  // Arguments after the operand already in `e.children[0]`.
  void ParseArgsInto(Expr& e) {
    Expr args;
    ParseCallArgs(args);
    for (auto& a : args.children) e.children.push_back(std::move(a));
    e.kwargs = std::move(args.kwargs);
  }

  ExprPtr ParsePostfix(ExprPtr node) {
    while (true) {
      if (IsOp(".")) {
        const Pos pos = Next().pos;
        const Token name = Next();
        auto e = Make(Expr::Kind::kAttr, pos);
        if (name.type == Tok::kName) {
          e->name = name.text;
        } else if (name.type == Tok::kInt) {
          e->kind = Expr::Kind::kItem;
          e->children.push_back(std::move(node));
          e->children.push_back(Literal(Value(name.int_value), name.pos));
          node = std::move(e);
          continue;
        } else {
          throw ParseError{name.pos, "expected an attribute name"};
        }
        e->children.push_back(std::move(node));
        node = std::move(e);
      } else if (IsOp("[")) {
        const Pos pos = Next().pos;
        ExprPtr parts[3];
        bool has[3] = {false, false, false};
        bool slice = false;
        for (int part = 0; part < 3; ++part) {
          if (!IsOp(":") && !IsOp("]")) {
            parts[part] = ParseExpression();
            has[part] = true;
          }
          if (part < 2 && AcceptOp(":")) {
            slice = true;
            continue;
          }
          break;
        }
        ExpectOp("]");
        if (!slice) {
          if (!has[0]) throw ParseError{pos, "expected a subscript"};
          auto e = Make(Expr::Kind::kItem, pos);
          e->children.push_back(std::move(node));
          e->children.push_back(std::move(parts[0]));
          node = std::move(e);
        } else {
          auto e = Make(Expr::Kind::kSlice, pos);
          e->children.push_back(std::move(node));
          for (int i = 0; i < 3; ++i) {
            e->has[i] = has[i];
            e->children.push_back(std::move(parts[i]));
          }
          node = std::move(e);
        }
      } else if (IsOp("(")) {
        const Pos pos = Next().pos;
        auto e = Make(Expr::Kind::kCall, pos);
        e->children.push_back(std::move(node));
        // Arguments after the callee.
        Expr args;
        ParseCallArgs(args);
        for (auto& a : args.children) e->children.push_back(std::move(a));
        e->kwargs = std::move(args.kwargs);
        node = std::move(e);
      } else {
        return node;
      }
    }
  }

  ExprPtr ParseFilterExpr(ExprPtr node) {
    while (true) {
      if (IsOp("|")) {
        const Pos pos = Next().pos;
        const Token name = Next();
        if (name.type != Tok::kName) throw ParseError{name.pos, "expected a filter name"};
        auto e = Make(Expr::Kind::kFilter, pos);
        e->name = name.text;
        e->children.push_back(std::move(node));
        if (AcceptOp("(")) ParseArgsInto(*e);
        node = std::move(e);
      } else if (IsName("is")) {
        const Pos pos = Next().pos;
        auto e = Make(Expr::Kind::kTest, pos);
        e->negated = AcceptName("not");
        const Token name = Next();
        if (name.type != Tok::kName) throw ParseError{name.pos, "expected a test name"};
        e->name = name.text;
        e->children.push_back(std::move(node));
        if (AcceptOp("(")) {
          ParseArgsInto(*e);
        } else if (Peek().type == Tok::kString || Peek().type == Tok::kInt ||
                   Peek().type == Tok::kFloat ||
                   (Peek().type == Tok::kName && !IsName("and") && !IsName("or") &&
                    !IsName("else") && !IsName("if") && !IsName("in") && !IsName("not") &&
                    !IsName("is"))) {
          // A test takes one argument without parentheses: `x is divisibleby 3`, `x is sameas
          // none`.
          e->children.push_back(ParsePostfix(ParsePrimary()));
        }
        node = std::move(e);
      } else if (IsOp("(")) {
        node = ParsePostfix(std::move(node));
      } else {
        return node;
      }
    }
  }

  std::vector<Segment> segments_;
  std::vector<std::pair<Pos, std::string>> open_;
  size_t seg_ = 0;
  std::vector<Token>* toks_ = nullptr;
  size_t tok_ = 0;
};

// ------------------------------------------------------------------------------------------------
// Evaluator

struct Scope {
  std::unordered_map<std::string, Value> vars;
  Scope* parent = nullptr;

  const Value* Lookup(const std::string& name) const {
    for (const Scope* s = this; s != nullptr; s = s->parent) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};

enum class Flow { kNormal, kBreak, kContinue };

struct Interp {
  Scope* root = nullptr;
  const Template::Strftime* strftime = nullptr;
  int depth = 0;

  // ---- statements

  Flow Exec(const Body& body, Scope& scope, std::string& out) {
    for (const NodePtr& node : body) {
      const Flow flow = ExecNode(*node, scope, out);
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  Flow ExecNode(const Node& node, Scope& scope, std::string& out) {
    switch (node.kind) {
      case Node::Kind::kText:
        out += node.text;
        return Flow::kNormal;
      case Node::Kind::kOutput:
        out += Str(Eval(*node.expr, scope));
        return Flow::kNormal;
      case Node::Kind::kIf:
        for (const auto& [cond, branch] : node.branches) {
          if (Truthy(Eval(*cond, scope))) return Exec(branch, scope, out);
        }
        return Exec(node.else_body, scope, out);
      case Node::Kind::kFor:
        return ExecFor(node, scope, out);
      case Node::Kind::kSet: {
        Value value = Eval(*node.expr, scope);
        if (!node.attr.empty()) {
          const Value* ns = scope.Lookup(node.targets[0]);
          if (ns == nullptr || !ns->is_namespace()) {
            Fail(At(node.pos) + ": cannot assign attribute on non-namespace object");
          }
          ns->Set(node.attr, std::move(value));
        } else if (node.targets.size() == 1) {
          scope.vars[node.targets[0]] = std::move(value);
        } else {
          Unpack(node.targets, value, scope, node.pos);
        }
        return Flow::kNormal;
      }
      case Node::Kind::kSetBlock: {
        std::string captured;
        Scope inner{{}, &scope};
        Exec(node.body, inner, captured);
        Value value(std::move(captured));
        for (const auto& [name, args] : node.block_filters) {
          Args call;
          for (const ExprPtr& a : args) call.positional.push_back(Eval(*a, scope));
          value = ApplyFilter(name, value, call, node.pos);
        }
        scope.vars[node.targets[0]] = std::move(value);
        return Flow::kNormal;
      }
      case Node::Kind::kMacro: {
        const Node* macro = &node;
        scope.vars[node.name] = Value::MakeCallable(
            node.name, [macro](Interp& in, Args& args) { return in.CallMacro(*macro, args); });
        return Flow::kNormal;
      }
      case Node::Kind::kBreak:
        return Flow::kBreak;
      case Node::Kind::kContinue:
        return Flow::kContinue;
      case Node::Kind::kGeneration:
        return Exec(node.body, scope, out);
    }
    return Flow::kNormal;
  }

  void Unpack(const std::vector<std::string>& targets, const Value& value, Scope& scope, Pos pos) {
    const List items = Iterate(value);
    if (items.size() != targets.size()) {
      Fail(At(pos) + ": cannot unpack " + std::to_string(items.size()) + " values into " +
           std::to_string(targets.size()) + " names");
    }
    for (size_t i = 0; i < targets.size(); ++i) scope.vars[targets[i]] = items[i];
  }

  Flow ExecFor(const Node& node, Scope& scope, std::string& out) {
    const Value iterable = Eval(*node.expr, scope);
    if (!(iterable.is_list() || iterable.is_dict() || iterable.is_string() ||
          iterable.is_undefined())) {
      Fail(At(node.expr->pos) + ": '" + TypeName(iterable) + "' object is not iterable");
    }
    List items = Iterate(iterable);
    if (node.filter) {
      List kept;
      for (const Value& item : items) {
        Scope probe{{}, &scope};
        Bind(node, item, probe);
        if (Truthy(Eval(*node.filter, probe))) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) return Exec(node.else_body, scope, out);
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      Scope iteration{{}, &scope};
      Bind(node, items[i], iteration);
      Dict loop = {{"index", Value(i + 1)},    {"index0", Value(i)},
                   {"revindex", Value(n - i)}, {"revindex0", Value(n - i - 1)},
                   {"first", Value(i == 0)},   {"last", Value(i == n - 1)},
                   {"length", Value(n)},       {"depth", Value(1)},
                   {"depth0", Value(0)}};
      if (i > 0) loop.emplace_back("previtem", items[i - 1]);
      if (i + 1 < n) loop.emplace_back("nextitem", items[i + 1]);
      loop.emplace_back("cycle", Value::MakeCallable("cycle", [i](Interp&, Args& args) {
                          if (args.positional.empty()) Fail("no items for cycling given");
                          return args.positional[i % args.positional.size()];
                        }));
      iteration.vars["loop"] = Value::MakeDict(std::move(loop));
      const Flow flow = Exec(node.body, iteration, out);
      if (flow == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  void Bind(const Node& node, const Value& item, Scope& scope) {
    if (node.targets.size() == 1) {
      scope.vars[node.targets[0]] = item;
    } else {
      Unpack(node.targets, item, scope, node.pos);
    }
  }

  Value CallMacro(const Node& macro, Args& args) {
    if (++depth > 256) Fail("macro recursion deeper than 256 calls");
    Scope scope{{}, root};
    size_t next = 0;
    for (const auto& [name, def] : macro.params) {
      const Value* given = nullptr;
      for (const auto& [key, v] : args.keyword) {
        if (key == name) given = &v;
      }
      if (given != nullptr) {
        scope.vars[name] = *given;
      } else if (next < args.positional.size()) {
        scope.vars[name] = args.positional[next++];
      } else if (def) {
        scope.vars[name] = Eval(*def, scope);
      } else {
        scope.vars[name] = Value::Undefined("parameter '" + name + "' was not provided");
      }
    }
    if (next < args.positional.size() && args.positional.size() > macro.params.size()) {
      Fail("macro '" + macro.name + "' takes not more than " + std::to_string(macro.params.size()) +
           " argument(s)");
    }
    std::string out;
    Exec(macro.body, scope, out);
    --depth;
    return Value(std::move(out));
  }

  // ---- expressions

  Value Eval(const Expr& e, Scope& scope) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.literal;
      case Expr::Kind::kName: {
        const Value* v = scope.Lookup(e.name);
        return v ? *v : Value::Undefined("'" + e.name + "' is undefined");
      }
      case Expr::Kind::kAttr: {
        const Value obj = Eval(*e.children[0], scope);
        if (obj.is_undefined()) Fail(At(e.pos) + ": " + UndefinedMessage(obj));
        try {
          return GetAttr(obj, e.name);
        } catch (RenderError& error) {
          error.message = At(e.pos) + ": " + error.message;
          throw;
        }
      }
      case Expr::Kind::kItem: {
        const Value obj = Eval(*e.children[0], scope);
        const Value key = Eval(*e.children[1], scope);
        if (obj.is_undefined()) Fail(At(e.pos) + ": " + UndefinedMessage(obj));
        return GetItem(obj, key);
      }
      case Expr::Kind::kSlice:
        return EvalSlice(e, scope);
      case Expr::Kind::kCall: {
        const Value fn = Eval(*e.children[0], scope);
        Args args;
        for (size_t i = 1; i < e.children.size(); ++i) {
          args.positional.push_back(Eval(*e.children[i], scope));
        }
        for (const auto& [key, value] : e.kwargs)
          args.keyword.emplace_back(key, Eval(*value, scope));
        if (fn.is_undefined()) Fail(At(e.pos) + ": " + UndefinedMessage(fn));
        if (!fn.is_callable()) Fail(At(e.pos) + ": '" + TypeName(fn) + "' object is not callable");
        try {
          return fn.callable().fn(*this, args);
        } catch (RenderError& error) {
          if (error.message.rfind("line ", 0) != 0)
            error.message = At(e.pos) + ": " + error.message;
          throw;
        }
      }
      case Expr::Kind::kFilter: {
        const Value value = Eval(*e.children[0], scope);
        Args args;
        for (size_t i = 1; i < e.children.size(); ++i) {
          args.positional.push_back(Eval(*e.children[i], scope));
        }
        for (const auto& [key, v] : e.kwargs) args.keyword.emplace_back(key, Eval(*v, scope));
        return ApplyFilter(e.name, value, args, e.pos);
      }
      case Expr::Kind::kTest: {
        const Value value = Eval(*e.children[0], scope);
        Args args;
        for (size_t i = 1; i < e.children.size(); ++i) {
          args.positional.push_back(Eval(*e.children[i], scope));
        }
        const bool result = ApplyTest(e.name, value, args, e.pos);
        return Value(e.negated ? !result : result);
      }
      case Expr::Kind::kNeg:
      case Expr::Kind::kPos: {
        const Value v = Eval(*e.children[0], scope);
        if (!v.is_number()) {
          Fail(At(e.pos) + ": bad operand type for unary " +
               (e.kind == Expr::Kind::kNeg ? "-" : "+") + ": '" + TypeName(v) + "'");
        }
        if (e.kind == Expr::Kind::kPos) return v.is_bool() ? Value(v.as_int()) : v;
        return v.is_float() ? Value(-v.as_float()) : Value(-v.as_int());
      }
      case Expr::Kind::kNot:
        return Value(!Truthy(Eval(*e.children[0], scope)));
      case Expr::Kind::kAnd: {
        Value left = Eval(*e.children[0], scope);
        return Truthy(left) ? Eval(*e.children[1], scope) : left;
      }
      case Expr::Kind::kOr: {
        Value left = Eval(*e.children[0], scope);
        return Truthy(left) ? left : Eval(*e.children[1], scope);
      }
      case Expr::Kind::kBinary: {
        const Value a = Eval(*e.children[0], scope);
        const Value b = Eval(*e.children[1], scope);
        try {
          return Arith(e.name, a, b);
        } catch (RenderError& error) {
          error.message = At(e.pos) + ": " + error.message;
          throw;
        }
      }
      case Expr::Kind::kCompare: {
        Value left = Eval(*e.children[0], scope);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = Eval(*e.children[i + 1], scope);
          bool ok;
          try {
            ok = CompareOp(e.ops[i], left, right);
          } catch (RenderError& error) {
            error.message = At(e.pos) + ": " + error.message;
            throw;
          }
          if (!ok) return Value(false);
          left = std::move(right);
        }
        return Value(true);
      }
      case Expr::Kind::kConcat: {
        std::string s;
        for (const ExprPtr& c : e.children) s += Str(Eval(*c, scope));
        return Value(std::move(s));
      }
      case Expr::Kind::kCond: {
        if (Truthy(Eval(*e.children[0], scope))) return Eval(*e.children[1], scope);
        if (e.children[2]) return Eval(*e.children[2], scope);
        return Value::Undefined(
            "the inline if expression evaluated to false and no else section was defined");
      }
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        List items;
        for (const ExprPtr& c : e.children) items.push_back(Eval(*c, scope));
        return Value::MakeList(std::move(items), e.kind == Expr::Kind::kTuple);
      }
      case Expr::Kind::kDict: {
        Dict items;
        for (size_t i = 0; i + 1 < e.children.size(); i += 2) {
          const Value key = Eval(*e.children[i], scope);
          if (!key.is_string())
            Fail(At(e.children[i]->pos) + ": dictionary keys must be strings here");
          Value v = Eval(*e.children[i + 1], scope);
          bool replaced = false;
          for (auto& [k, existing] : items) {
            if (k == key.str()) {
              existing = v;
              replaced = true;
            }
          }
          if (!replaced) items.emplace_back(key.str(), std::move(v));
        }
        return Value::MakeDict(std::move(items));
      }
    }
    return Value();
  }

  static std::string UndefinedMessage(const Value& v) {
    return v.undefined_hint().empty() ? "value is undefined" : v.undefined_hint();
  }

  bool CompareOp(const std::string& op, const Value& a, const Value& b) {
    if (op == "==") return Equal(a, b);
    if (op == "!=") return !Equal(a, b);
    if (op == "in") return Contains(b, a);
    if (op == "notin") return !Contains(b, a);
    if (a.is_undefined() || b.is_undefined()) Fail(UndefinedMessage(a.is_undefined() ? a : b));
    const int c = Compare(a, b, op);
    if (op == "<") return c < 0;
    if (op == "<=") return c <= 0;
    if (op == ">") return c > 0;
    return c >= 0;
  }

  Value Arith(const std::string& op, const Value& a, const Value& b) {
    if (a.is_undefined() || b.is_undefined()) Fail(UndefinedMessage(a.is_undefined() ? a : b));
    const auto unsupported = [&]() -> Value {
      Fail("unsupported operand type(s) for " + op + ": '" + TypeName(a) + "' and '" + TypeName(b) +
           "'");
    };
    if (op == "+") {
      if (a.is_string() && b.is_string()) return Value(a.str() + b.str());
      if (a.is_list() && b.is_list()) {
        if (a.is_tuple() != b.is_tuple()) return unsupported();
        List items = a.list();
        items.insert(items.end(), b.list().begin(), b.list().end());
        return Value::MakeList(std::move(items), a.is_tuple());
      }
    }
    if (op == "*") {
      const Value* seq = a.is_string() || a.is_list()   ? &a
                         : b.is_string() || b.is_list() ? &b
                                                        : nullptr;
      const Value* count = seq == &a ? &b : &a;
      if (seq != nullptr && (count->is_int() || count->is_bool())) {
        const int64_t n = std::max<int64_t>(0, count->as_int());
        if (seq->is_string()) {
          std::string s;
          for (int64_t i = 0; i < n; ++i) s += seq->str();
          return Value(std::move(s));
        }
        List items;
        for (int64_t i = 0; i < n; ++i)
          items.insert(items.end(), seq->list().begin(), seq->list().end());
        return Value::MakeList(std::move(items), seq->is_tuple());
      }
    }
    if (op == "%" && a.is_string()) return PercentFormat(a.str(), b);
    if (!a.is_number() || !b.is_number()) return unsupported();
    const bool floats = a.is_float() || b.is_float();
    if (op == "+")
      return floats ? Value(a.as_float() + b.as_float()) : Value(a.as_int() + b.as_int());
    if (op == "-")
      return floats ? Value(a.as_float() - b.as_float()) : Value(a.as_int() - b.as_int());
    if (op == "*")
      return floats ? Value(a.as_float() * b.as_float()) : Value(a.as_int() * b.as_int());
    if (op == "/") {
      if (b.as_float() == 0) Fail("division by zero");
      return Value(a.as_float() / b.as_float());
    }
    if (op == "//" || op == "%") {
      if (floats) {
        if (b.as_float() == 0) Fail("float division by zero");
        const double q = std::floor(a.as_float() / b.as_float());
        return op == "//" ? Value(q) : Value(a.as_float() - q * b.as_float());
      }
      if (b.as_int() == 0) Fail("integer division or modulo by zero");
      int64_t q = a.as_int() / b.as_int();
      if ((a.as_int() % b.as_int() != 0) && ((a.as_int() < 0) != (b.as_int() < 0))) --q;
      return op == "//" ? Value(q) : Value(a.as_int() - q * b.as_int());
    }
    if (op == "**") {
      if (!floats && b.as_int() >= 0) {
        int64_t r = 1;
        for (int64_t i = 0; i < b.as_int(); ++i) r *= a.as_int();
        return Value(r);
      }
      return Value(std::pow(a.as_float(), b.as_float()));
    }
    return unsupported();
  }

  // printf-style `'%s' % value`, the conversions templates use.
  Value PercentFormat(const std::string& format, const Value& args) {
    List values = args.is_tuple() ? args.list() : List{args};
    size_t next = 0;
    std::string out;
    for (size_t i = 0; i < format.size(); ++i) {
      if (format[i] != '%') {
        out += format[i];
        continue;
      }
      if (++i >= format.size()) Fail("incomplete format");
      const char c = format[i];
      if (c == '%') {
        out += '%';
        continue;
      }
      if (next >= values.size()) Fail("not enough arguments for format string");
      const Value& v = values[next++];
      if (c == 's') {
        out += Str(v);
      } else if (c == 'r') {
        out += Repr(v);
      } else if (c == 'd' || c == 'i') {
        if (!v.is_number()) Fail("%d format: a real number is required, not " + TypeName(v));
        out += std::to_string(v.is_float() ? static_cast<int64_t>(v.as_float()) : v.as_int());
      } else {
        Fail(std::string("unsupported format character '") + c + "'");
      }
    }
    if (next < values.size()) Fail("not all arguments converted during string formatting");
    return Value(std::move(out));
  }

  Value EvalSlice(const Expr& e, Scope& scope) {
    const Value obj = Eval(*e.children[0], scope);
    std::optional<int64_t> parts[3];
    for (int i = 0; i < 3; ++i) {
      if (!e.has[i]) continue;
      const Value v = Eval(*e.children[i + 1], scope);
      if (v.is_none()) continue;
      if (!v.is_int() && !v.is_bool()) Fail(At(e.pos) + ": slice indices must be integers or None");
      parts[i] = v.as_int();
    }
    const int64_t step = parts[2].value_or(1);
    if (step == 0) Fail(At(e.pos) + ": slice step cannot be zero");
    List items;
    std::vector<std::string_view> cps;
    if (obj.is_string()) {
      cps = CodePoints(obj.str());
    } else if (obj.is_list()) {
      items = obj.list();
    } else {
      Fail(At(e.pos) + ": '" + TypeName(obj) + "' object is not subscriptable");
    }
    const int64_t n =
        obj.is_string() ? static_cast<int64_t>(cps.size()) : static_cast<int64_t>(items.size());
    const auto clamp = [&](std::optional<int64_t> v, int64_t fallback) {
      if (!v) return fallback;
      int64_t x = *v;
      if (x < 0) x += n;
      if (step > 0) return std::clamp<int64_t>(x, 0, n);
      return std::clamp<int64_t>(x, -1, n - 1);
    };
    const int64_t start = clamp(parts[0], step > 0 ? 0 : n - 1);
    const int64_t stop = clamp(parts[1], step > 0 ? n : -1);
    std::vector<int64_t> picked;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) picked.push_back(i);
    if (obj.is_string()) {
      std::string s;
      for (int64_t i : picked) s += cps[i];
      return Value(std::move(s));
    }
    List out;
    for (int64_t i : picked) out.push_back(items[i]);
    return Value::MakeList(std::move(out), obj.is_tuple());
  }

  Value GetItem(const Value& obj, const Value& key) {
    if (obj.is_dict() || obj.is_namespace()) {
      if (key.is_string()) {
        if (const Value* v = obj.Find(key.str())) return *v;
        if (obj.is_dict()) return GetAttr(obj, key.str());
      }
      return Value::Undefined("'dict object' has no attribute " + Repr(key));
    }
    if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
      int64_t i = key.as_int();
      if (obj.is_string()) {
        const auto cps = CodePoints(obj.str());
        if (i < 0) i += static_cast<int64_t>(cps.size());
        if (i < 0 || i >= static_cast<int64_t>(cps.size()))
          return Value::Undefined("string index out of range");
        return Value(std::string(cps[i]));
      }
      if (i < 0) i += static_cast<int64_t>(obj.list().size());
      if (i < 0 || i >= static_cast<int64_t>(obj.list().size())) {
        return Value::Undefined("list object has no element " + std::to_string(key.as_int()));
      }
      return obj.list()[i];
    }
    if (key.is_string()) return GetAttr(obj, key.str());
    return Value::Undefined("'" + TypeName(obj) + " object' has no attribute " + Repr(key));
  }

  Value Method(const std::string& name, std::function<Value(Args&)> fn) {
    return Value::MakeCallable(name,
                               [fn = std::move(fn)](Interp&, Args& args) { return fn(args); });
  }

  Value GetAttr(const Value& obj, const std::string& name);
  Value ApplyFilter(const std::string& name, const Value& value, Args& args, Pos pos);
  bool ApplyTest(const std::string& name, const Value& value, Args& args, Pos pos);
};

// Argument access in Python's style: positional index or keyword name, with a default.
const Value* Arg(const Args& args, size_t index, std::string_view keyword) {
  for (const auto& [k, v] : args.keyword) {
    if (k == keyword) return &v;
  }
  return index < args.positional.size() ? &args.positional[index] : nullptr;
}

std::string StrArg(const Args& args, size_t index, std::string_view keyword, std::string fallback) {
  const Value* v = Arg(args, index, keyword);
  if (v == nullptr || v->is_none()) return fallback;
  if (!v->is_string()) Fail(std::string(keyword) + " must be str, not " + TypeName(*v));
  return v->str();
}

std::vector<std::string> PySplit(const std::string& s, const Value* sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep == nullptr || sep->is_none()) {
    const auto cps = CodePoints(s);
    size_t i = 0;
    while (i < cps.size()) {
      while (i < cps.size() && IsPySpace(DecodeOne(cps[i]))) ++i;
      if (i >= cps.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        std::string rest;
        for (size_t j = i; j < cps.size(); ++j) rest += cps[j];
        out.push_back(PyStrip(rest, std::nullopt, false, true));
        return out;
      }
      std::string word;
      while (i < cps.size() && !IsPySpace(DecodeOne(cps[i]))) word += cps[i++];
      out.push_back(std::move(word));
    }
    return out;
  }
  if (!sep->is_string()) Fail("must be str or None, not " + TypeName(*sep));
  const std::string& d = sep->str();
  if (d.empty()) Fail("empty separator");
  size_t start = 0;
  while (true) {
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) break;
    const size_t at = s.find(d, start);
    if (at == std::string::npos) break;
    out.push_back(s.substr(start, at - start));
    start = at + d.size();
  }
  out.push_back(s.substr(start));
  return out;
}

Value StringList(const std::vector<std::string>& parts) {
  List items;
  for (const std::string& p : parts) items.emplace_back(p);
  return Value::MakeList(std::move(items));
}

Value Interp::GetAttr(const Value& obj, const std::string& name) {
  if (obj.is_namespace()) {
    if (const Value* v = obj.Find(name)) return *v;
    return Value::Undefined("'Namespace' object has no attribute '" + name + "'");
  }
  if (obj.is_dict()) {
    if (name == "get") {
      return Method(name, [obj](Args& args) {
        if (args.positional.empty()) Fail("get expected at least 1 argument, got 0");
        const Value& key = args.positional[0];
        if (key.is_string()) {
          if (const Value* v = obj.Find(key.str())) return *v;
        }
        return args.positional.size() > 1 ? args.positional[1] : Value::None();
      });
    }
    if (name == "items" || name == "keys" || name == "values") {
      return Method(name, [obj, name](Args&) {
        List items;
        for (const auto& [k, v] : obj.dict()) {
          if (name == "items") {
            items.push_back(Value::MakeList({Value(k), v}, true));
          } else {
            items.push_back(name == "keys" ? Value(k) : v);
          }
        }
        return Value::MakeList(std::move(items));
      });
    }
    if (const Value* v = obj.Find(name)) return *v;
    return Value::Undefined("'dict object' has no attribute '" + name + "'");
  }
  if (obj.is_string()) {
    const std::string s = obj.str();
    if (name == "startswith" || name == "endswith") {
      return Method(name, [s, name](Args& args) {
        if (args.positional.empty()) Fail(name + " takes at least 1 argument");
        List candidates =
            args.positional[0].is_tuple() ? args.positional[0].list() : List{args.positional[0]};
        for (const Value& c : candidates) {
          if (!c.is_string()) Fail(name + " first arg must be str or a tuple of str");
          const std::string& p = c.str();
          if (p.size() > s.size()) continue;
          if (name == "startswith" ? s.compare(0, p.size(), p) == 0
                                   : s.compare(s.size() - p.size(), p.size(), p) == 0) {
            return Value(true);
          }
        }
        return Value(false);
      });
    }
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      return Method(name, [s, name](Args& args) {
        const Value* chars = Arg(args, 0, "chars");
        std::optional<std::string> set;
        if (chars != nullptr && !chars->is_none()) {
          if (!chars->is_string()) Fail(name + " arg must be None or str");
          set = chars->str();
        }
        return Value(PyStrip(s, set, name != "rstrip", name != "lstrip"));
      });
    }
    if (name == "split" || name == "rsplit") {
      return Method(name, [s, name](Args& args) {
        const Value* sep = Arg(args, 0, "sep");
        const Value* max = Arg(args, 1, "maxsplit");
        const int64_t maxsplit = max != nullptr ? max->as_int() : -1;
        if (name == "rsplit" && maxsplit >= 0) {
          // Split from the right: reverse, split with the reversed separator, reverse back.
          if (sep == nullptr || sep->is_none() || !sep->is_string()) {
            Fail("rsplit with maxsplit needs a separator here");
          }
          std::vector<std::string> parts;
          std::string rest = s;
          const std::string& d = sep->str();
          for (int64_t k = 0; k < maxsplit; ++k) {
            const size_t at = rest.rfind(d);
            if (at == std::string::npos) break;
            parts.insert(parts.begin(), rest.substr(at + d.size()));
            rest.resize(at);
          }
          parts.insert(parts.begin(), rest);
          return StringList(parts);
        }
        return StringList(PySplit(s, sep, maxsplit));
      });
    }
    if (name == "upper" || name == "lower") {
      return Method(name, [s, name](Args&) { return Value(CaseMap(s, name == "upper")); });
    }
    if (name == "capitalize" || name == "title") {
      return Method(name, [s, name](Args&) { return Value(Capitalize(s, name == "title")); });
    }
    if (name == "replace") {
      return Method(name, [s](Args& args) {
        if (args.positional.size() < 2 || !args.positional[0].is_string() ||
            !args.positional[1].is_string()) {
          Fail("replace expects two strings");
        }
        const int64_t count = args.positional.size() > 2 ? args.positional[2].as_int() : -1;
        return Value(Replace(s, args.positional[0].str(), args.positional[1].str(), count));
      });
    }
    if (name == "find" || name == "rfind" || name == "index" || name == "count") {
      return Method(name, [s, name](Args& args) {
        if (args.positional.empty() || !args.positional[0].is_string())
          Fail(name + " expects a string");
        const std::string& sub = args.positional[0].str();
        if (name == "count") {
          if (sub.empty()) return Value(static_cast<int64_t>(CodePoints(s).size() + 1));
          int64_t n = 0;
          for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size()))
            ++n;
          return Value(n);
        }
        const size_t at = name == "rfind" ? s.rfind(sub) : s.find(sub);
        if (at == std::string::npos) {
          if (name == "index") Fail("substring not found");
          return Value(static_cast<int64_t>(-1));
        }
        return Value(static_cast<int64_t>(CodePoints(s.substr(0, at)).size()));
      });
    }
    if (name == "join") {
      return Method(name, [s](Args& args) {
        if (args.positional.empty()) Fail("join takes exactly one argument");
        std::string out;
        bool first = true;
        for (const Value& v : Iterate(args.positional[0])) {
          if (!v.is_string())
            Fail("sequence item: expected str instance, " + TypeName(v) + " found");
          if (!first) out += s;
          first = false;
          out += v.str();
        }
        return Value(std::move(out));
      });
    }
    if (name == "splitlines") {
      return Method(name, [s](Args&) {
        std::vector<std::string> lines;
        size_t start = 0;
        for (size_t i = 0; i < s.size(); ++i) {
          if (s[i] == '\n' || s[i] == '\r') {
            lines.push_back(s.substr(start, i - start));
            if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
            start = i + 1;
          }
        }
        if (start < s.size()) lines.push_back(s.substr(start));
        return StringList(lines);
      });
    }
    if (name == "isdigit" || name == "isalpha" || name == "isspace" || name == "isalnum" ||
        name == "islower" || name == "isupper") {
      return Method(name, [s, name](Args&) {
        if (s.empty()) return Value(false);
        bool cased = false;
        for (std::string_view cp : CodePoints(s)) {
          const uint32_t c = DecodeOne(cp);
          if (name == "isspace") {
            if (!IsPySpace(c)) return Value(false);
            continue;
          }
          if (c >= 0x80) return Value(false);
          const unsigned char b = static_cast<unsigned char>(c);
          if (name == "isdigit" && !std::isdigit(b)) return Value(false);
          if (name == "isalpha" && !std::isalpha(b)) return Value(false);
          if (name == "isalnum" && !std::isalnum(b)) return Value(false);
          if (name == "islower" && std::isupper(b)) return Value(false);
          if (name == "isupper" && std::islower(b)) return Value(false);
          if (std::isalpha(b)) cased = true;
        }
        return Value(name == "islower" || name == "isupper" ? cased : true);
      });
    }
    return Value::Undefined("'str object' has no attribute '" + name + "'");
  }
  if (obj.is_list() && (name == "index" || name == "count")) {
    return Method(name, [obj, name](Args& args) {
      if (args.positional.empty()) Fail(name + " takes exactly one argument");
      int64_t count = 0;
      for (size_t i = 0; i < obj.list().size(); ++i) {
        if (Equal(obj.list()[i], args.positional[0])) {
          if (name == "index") return Value(static_cast<int64_t>(i));
          ++count;
        }
      }
      if (name == "index") Fail("value is not in list");
      return Value(count);
    });
  }
  if (obj.is_list() || obj.is_dict()) {
    // The sandbox refuses methods that modify a value (append, update, pop, ...).
    static const char* const kMutating[] = {"append", "extend",     "insert", "pop",
                                            "remove", "clear",      "sort",   "reverse",
                                            "update", "setdefault", "popitem"};
    for (const char* m : kMutating) {
      if (name == m) {
        Fail("access to attribute '" + name + "' of '" + TypeName(obj) + "' object is unsafe");
      }
    }
  }
  return Value::Undefined("'" + TypeName(obj) + " object' has no attribute '" + name + "'");
}

}  // namespace

// Helpers used by the methods above and the filters below.
namespace {

std::string Capitalize(const std::string& s, bool title) {
  std::string out;
  bool start = true;
  for (std::string_view cp : CodePoints(s)) {
    const std::string piece(cp);
    const bool alpha = cp.size() > 1 || std::isalpha(static_cast<unsigned char>(cp[0]));
    if (start && alpha) {
      out += CaseMap(piece, true);
    } else {
      out += CaseMap(piece, false);
    }
    if (title) {
      start = !alpha;
    } else {
      start = false;
    }
  }
  return out;
}

std::string Replace(const std::string& s, const std::string& from, const std::string& to,
                    int64_t count) {
  std::string out;
  if (from.empty()) {
    int64_t n = 0;
    for (std::string_view cp : CodePoints(s)) {
      if (count < 0 || n < count) {
        out += to;
        ++n;
      }
      out += cp;
    }
    if (count < 0 || n < count) out += to;
    return out;
  }
  size_t start = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    const size_t at = s.find(from, start);
    if (at == std::string::npos) break;
    out += s.substr(start, at - start);
    out += to;
    start = at + from.size();
    ++n;
  }
  out += s.substr(start);
  return out;
}

const char* const kFilters[] = {
    "trim",       "tojson",  "length",     "count",    "items", "string", "int",      "float",
    "lower",      "upper",   "capitalize", "title",    "join",  "first",  "last",     "list",
    "reverse",    "replace", "default",    "d",        "map",   "select", "reject",   "selectattr",
    "rejectattr", "unique",  "sort",       "dictsort", "sum",   "min",    "max",      "abs",
    "round",      "indent",  "safe",       "escape",   "e",     "batch",  "wordcount"};
const char* const kTests[] = {
    "defined",  "undefined", "none",    "string",      "number",   "integer",     "float",
    "boolean",  "true",      "false",   "mapping",     "iterable", "sequence",    "callable",
    "sameas",   "eq",        "equalto", "==",          "ne",       "!=",          "lt",
    "lessthan", "<",         "le",      "<=",          "gt",       "greaterthan", ">",
    "ge",       ">=",        "in",      "divisibleby", "even",     "odd",         "lower",
    "upper",    "escaped",   "filter",  "test"};

bool Known(const char* const* begin, const char* const* end, const std::string& name) {
  return std::any_of(begin, end, [&](const char* k) { return name == k; });
}

bool Interp::ApplyTest(const std::string& name, const Value& value, Args& args, Pos pos) {
  const auto arg = [&]() -> const Value& {
    if (args.positional.empty()) Fail(At(pos) + ": test '" + name + "' needs an argument");
    return args.positional[0];
  };
  if (name == "defined") return !value.is_undefined();
  if (name == "undefined") return value.is_undefined();
  if (name == "none") return value.is_none();
  if (name == "string") return value.is_string();
  if (name == "number") return value.is_number();
  if (name == "integer") return value.is_int();
  if (name == "float") return value.is_float();
  if (name == "boolean") return value.is_bool();
  if (name == "true") return value.is_bool() && value.as_int() != 0;
  if (name == "false") return value.is_bool() && value.as_int() == 0;
  if (name == "mapping") return value.is_dict();
  if (name == "iterable")
    return value.is_list() || value.is_dict() || value.is_string() || value.is_undefined();
  if (name == "sequence")
    return value.is_list() || value.is_dict() || value.is_string() || value.is_undefined();
  if (name == "callable") return value.is_callable();
  if (name == "sameas") {
    const Value& other = arg();
    if (value.is_none() || value.is_bool() || other.is_none() || other.is_bool()) {
      return value.kind() == other.kind() && Equal(value, other);
    }
    return false;
  }
  if (name == "eq" || name == "equalto" || name == "==") return Equal(value, arg());
  if (name == "ne" || name == "!=") return !Equal(value, arg());
  if (name == "lt" || name == "lessthan" || name == "<") return Compare(value, arg(), "<") < 0;
  if (name == "le" || name == "<=") return Compare(value, arg(), "<=") <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return Compare(value, arg(), ">") > 0;
  if (name == "ge" || name == ">=") return Compare(value, arg(), ">=") >= 0;
  if (name == "in") return Contains(arg(), value);
  if (name == "divisibleby" || name == "even" || name == "odd") {
    if (!value.is_int() && !value.is_bool())
      Fail(At(pos) + ": test '" + name + "' needs an integer");
    const int64_t d = name == "divisibleby" ? arg().as_int() : 2;
    if (d == 0) Fail(At(pos) + ": integer division or modulo by zero");
    const int64_t r = ((value.as_int() % d) + d) % d;
    return name == "odd" ? r != 0 : r == 0;
  }
  if (name == "lower" || name == "upper") {
    if (!value.is_string()) return false;
    return CaseMap(value.str(), name == "upper") == value.str();
  }
  if (name == "escaped") return false;
  if (name == "filter")
    return value.is_string() && Known(std::begin(kFilters), std::end(kFilters), value.str());
  if (name == "test")
    return value.is_string() && Known(std::begin(kTests), std::end(kTests), value.str());
  Fail(At(pos) + ": unsupported test '" + name + "'");
}

// The attribute a map/sort/selectattr filter reads: "a.b" walks nested items, "0" indexes.
Value AttributePath(Interp& in, const Value& item, const std::string& path) {
  Value v = item;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    if (v.is_undefined()) return v;
    v = numeric ? in.GetItem(v, Value(static_cast<int64_t>(std::stoll(part))))
                : in.GetItem(v, Value(part));
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

Value Interp::ApplyFilter(const std::string& name, const Value& value, Args& args, Pos pos) {
  try {
    if (name == "safe") return value;
    if (name == "default" || name == "d") {
      const Value* fallback = Arg(args, 0, "default_value");
      const Value* boolean = Arg(args, 1, "boolean");
      const bool use =
          value.is_undefined() || (boolean != nullptr && Truthy(*boolean) && !Truthy(value));
      if (use) return fallback != nullptr ? *fallback : Value(std::string());
      return value;
    }
    if (name == "tojson") {
      JsonStyle style;
      if (const Value* v = Arg(args, 0, "ensure_ascii")) style.ensure_ascii = Truthy(*v);
      if (const Value* v = Arg(args, 1, "indent"); v != nullptr && !v->is_none()) {
        if (!v->is_int()) Fail("indent must be an integer here");
        style.indent = static_cast<int>(std::max<int64_t>(0, v->as_int()));
      }
      style.item_separator = style.indent >= 0 ? "," : ", ";
      style.key_separator = ": ";
      if (const Value* v = Arg(args, 2, "separators"); v != nullptr && !v->is_none()) {
        if (!v->is_list() || v->list().size() != 2 || !v->list()[0].is_string() ||
            !v->list()[1].is_string()) {
          Fail("separators must be a pair of strings");
        }
        style.item_separator = v->list()[0].str();
        style.key_separator = v->list()[1].str();
      }
      if (const Value* v = Arg(args, 3, "sort_keys")) style.sort_keys = Truthy(*v);
      std::string out;
      Json(value, style, 0, out);
      return Value(std::move(out));
    }
    if (name == "trim") {
      std::optional<std::string> chars;
      if (const Value* v = Arg(args, 0, "chars"); v != nullptr && !v->is_none()) chars = Str(*v);
      return Value(PyStrip(Str(value), chars, true, true));
    }
    if (name == "length" || name == "count") return Value(static_cast<int64_t>(Length(value)));
    if (name == "string") return value.is_string() ? value : Value(Str(value));
    if (name == "lower" || name == "upper") return Value(CaseMap(Str(value), name == "upper"));
    if (name == "capitalize" || name == "title")
      return Value(Capitalize(Str(value), name == "title"));
    if (name == "items") {
      if (value.is_undefined()) return Value::MakeList({});
      if (!value.is_dict()) Fail("Can only get item pairs from a mapping.");
      List items;
      for (const auto& [k, v] : value.dict()) items.push_back(Value::MakeList({Value(k), v}, true));
      return Value::MakeList(std::move(items));
    }
    if (name == "int") {
      const Value* fallback = Arg(args, 0, "default");
      const Value d = fallback ? *fallback : Value(static_cast<int64_t>(0));
      if (value.is_int() || value.is_bool()) return Value(value.as_int());
      if (value.is_float()) return Value(static_cast<int64_t>(value.as_float()));
      if (value.is_string()) {
        const std::string s = PyStrip(value.str(), std::nullopt, true, true);
        int64_t out = 0;
        auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
        if (ec == std::errc() && p == s.data() + s.size() && !s.empty()) return Value(out);
        char* end = nullptr;
        const double f = std::strtod(s.c_str(), &end);
        if (!s.empty() && end == s.c_str() + s.size()) return Value(static_cast<int64_t>(f));
      }
      return d;
    }
    if (name == "float") {
      const Value* fallback = Arg(args, 0, "default");
      const Value d = fallback ? *fallback : Value(0.0);
      if (value.is_number()) return Value(value.as_float());
      if (value.is_string()) {
        const std::string s = PyStrip(value.str(), std::nullopt, true, true);
        char* end = nullptr;
        const double f = std::strtod(s.c_str(), &end);
        if (!s.empty() && end == s.c_str() + s.size()) return Value(f);
      }
      return d;
    }
    if (name == "abs") {
      if (value.is_float()) return Value(std::fabs(value.as_float()));
      if (value.is_number()) return Value(static_cast<int64_t>(std::llabs(value.as_int())));
      Fail("bad operand type for abs(): '" + TypeName(value) + "'");
    }
    if (name == "round") {
      const Value* precision = Arg(args, 0, "precision");
      const std::string method = StrArg(args, 1, "method", "common");
      const int64_t digits = precision ? precision->as_int() : 0;
      if (method == "common") {
        // Python's round(): ints stay ints; floats round their exact binary value, halves to
        // even, which is what printf's conversion does.
        if (value.is_int() || value.is_bool()) return Value(value.as_int());
        if (digits >= 0 && digits < 30) {
          char buf[512];
          std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(digits), value.as_float());
          return Value(std::strtod(buf, nullptr));
        }
      }
      const double scale = std::pow(10.0, static_cast<double>(digits));
      const double x = value.as_float() * scale;
      const double r = method == "ceil"    ? std::ceil(x)
                       : method == "floor" ? std::floor(x)
                                           : std::nearbyint(x);
      return Value(r / scale);
    }
    if (name == "join") {
      const std::string sep = StrArg(args, 0, "d", "");
      const Value* attribute = Arg(args, 1, "attribute");
      std::string out;
      bool first = true;
      for (const Value& item : Iterate(value)) {
        if (!first) out += sep;
        first = false;
        out += Str(attribute ? AttributePath(*this, item, Str(*attribute)) : item);
      }
      return Value(std::move(out));
    }
    if (name == "first" || name == "last") {
      const List items = Iterate(value);
      if (items.empty()) return Value::Undefined("No " + name + " item, sequence was empty.");
      return name == "first" ? items.front() : items.back();
    }
    if (name == "list") return Value::MakeList(Iterate(value));
    if (name == "reverse") {
      if (value.is_string()) {
        auto cps = CodePoints(value.str());
        std::string out;
        for (auto it = cps.rbegin(); it != cps.rend(); ++it) out += *it;
        return Value(std::move(out));
      }
      List items = Iterate(value);
      std::reverse(items.begin(), items.end());
      return Value::MakeList(std::move(items));
    }
    if (name == "replace") {
      if (args.positional.size() < 2) Fail("replace needs the old and the new text");
      const Value* count = Arg(args, 2, "count");
      return Value(Replace(Str(value), Str(args.positional[0]), Str(args.positional[1]),
                           count && !count->is_none() ? count->as_int() : -1));
    }
    if (name == "unique") {
      List out;
      for (const Value& item : Iterate(value)) {
        bool seen = false;
        for (const Value& o : out) {
          if (Equal(o, item) || (o.is_string() && item.is_string() &&
                                 CaseMap(o.str(), false) == CaseMap(item.str(), false))) {
            seen = true;
          }
        }
        if (!seen) out.push_back(item);
      }
      return Value::MakeList(std::move(out));
    }
    if (name == "sort" || name == "min" || name == "max") {
      const Value* reverse = name == "sort" ? Arg(args, 0, "reverse") : nullptr;
      const Value* case_sensitive = Arg(args, name == "sort" ? 1 : 0, "case_sensitive");
      const Value* attribute = Arg(args, name == "sort" ? 2 : 1, "attribute");
      List items = Iterate(value);
      const auto key = [&](const Value& item) {
        Value k = attribute ? AttributePath(*this, item, Str(*attribute)) : item;
        if (k.is_string() && !(case_sensitive && Truthy(*case_sensitive)))
          k = Value(CaseMap(k.str(), false));
        return k;
      };
      std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
        return Compare(key(a), key(b), "<") < 0;
      });
      if (name == "min")
        return items.empty() ? Value::Undefined("No aggregated item, sequence was empty.")
                             : items.front();
      if (name == "max") {
        if (items.empty()) return Value::Undefined("No aggregated item, sequence was empty.");
        // max keeps the first of equal largest items, as Python's max does.
        Value best = items.back();
        for (const Value& item : items) {
          if (Compare(key(item), key(best), "<") == 0) return item;
        }
        return best;
      }
      if (reverse && Truthy(*reverse)) std::reverse(items.begin(), items.end());
      return Value::MakeList(std::move(items));
    }
    if (name == "dictsort") {
      if (!value.is_dict()) Fail("dictsort needs a mapping");
      List items;
      for (const auto& [k, v] : value.dict()) items.push_back(Value::MakeList({Value(k), v}, true));
      std::stable_sort(items.begin(), items.end(), [](const Value& a, const Value& b) {
        return CaseMap(a.list()[0].str(), false) < CaseMap(b.list()[0].str(), false);
      });
      return Value::MakeList(std::move(items));
    }
    if (name == "sum") {
      const Value* attribute = Arg(args, 0, "attribute");
      const Value* start = Arg(args, 1, "start");
      Value total = start ? *start : Value(static_cast<int64_t>(0));
      for (const Value& item : Iterate(value)) {
        total = Arith("+", total, attribute ? AttributePath(*this, item, Str(*attribute)) : item);
      }
      return total;
    }
    if (name == "map") {
      List out;
      const Value* attribute = Arg(args, 99, "attribute");
      if (attribute != nullptr) {
        const Value* fallback = Arg(args, 99, "default");
        for (const Value& item : Iterate(value)) {
          Value v = AttributePath(*this, item, Str(*attribute));
          if (v.is_undefined() && fallback != nullptr) v = *fallback;
          out.push_back(v);
        }
        return Value::MakeList(std::move(out));
      }
      if (args.positional.empty() || !args.positional[0].is_string())
        Fail("map needs a filter name or attribute=");
      const std::string filter = args.positional[0].str();
      if (!Known(std::begin(kFilters), std::end(kFilters), filter))
        Fail("unsupported filter '" + filter + "'");
      Args rest;
      rest.positional.assign(args.positional.begin() + 1, args.positional.end());
      for (const Value& item : Iterate(value)) out.push_back(ApplyFilter(filter, item, rest, pos));
      return Value::MakeList(std::move(out));
    }
    if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
      const bool by_attr = name == "selectattr" || name == "rejectattr";
      const bool keep_if = name == "select" || name == "selectattr";
      size_t next = 0;
      std::string attribute;
      if (by_attr) {
        if (args.positional.empty()) Fail(name + " needs an attribute name");
        attribute = Str(args.positional[next++]);
      }
      std::string test;
      if (next < args.positional.size()) test = Str(args.positional[next++]);
      Args rest;
      rest.positional.assign(args.positional.begin() + next, args.positional.end());
      if (!test.empty() && !Known(std::begin(kTests), std::end(kTests), test))
        Fail("unsupported test '" + test + "'");
      List out;
      for (const Value& item : Iterate(value)) {
        const Value subject = by_attr ? AttributePath(*this, item, attribute) : item;
        const bool pass = test.empty() ? Truthy(subject) : ApplyTest(test, subject, rest, pos);
        if (pass == keep_if) out.push_back(item);
      }
      return Value::MakeList(std::move(out));
    }
    if (name == "indent") {
      const Value* width = Arg(args, 0, "width");
      const Value* first = Arg(args, 1, "first");
      const Value* blank = Arg(args, 2, "blank");
      const std::string pad = width && width->is_string()
                                  ? width->str()
                                  : std::string(width ? width->as_int() : 4, ' ');
      const std::string s = Str(value);
      std::string out;
      size_t start = 0;
      bool first_line = true;
      while (start <= s.size()) {
        size_t nl = s.find('\n', start);
        const std::string line =
            s.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
        const bool indent_it =
            first_line ? (first && Truthy(*first)) : (!line.empty() || (blank && Truthy(*blank)));
        if (indent_it) out += pad;
        out += line;
        if (nl == std::string::npos) break;
        out += '\n';
        start = nl + 1;
        first_line = false;
      }
      return Value(std::move(out));
    }
    if (name == "escape" || name == "e") {
      std::string out;
      for (char c : Str(value)) {
        switch (c) {
          case '&':
            out += "&amp;";
            break;
          case '<':
            out += "&lt;";
            break;
          case '>':
            out += "&gt;";
            break;
          case '"':
            out += "&#34;";
            break;
          case '\'':
            out += "&#39;";
            break;
          default:
            out += c;
        }
      }
      return Value(std::move(out));
    }
    if (name == "wordcount")
      return Value(static_cast<int64_t>(PySplit(Str(value), nullptr, -1).size()));
    if (name == "batch") {
      const Value* size = Arg(args, 0, "linecount");
      if (size == nullptr || size->as_int() <= 0) Fail("batch needs a positive size");
      List out, current;
      for (const Value& item : Iterate(value)) {
        current.push_back(item);
        if (static_cast<int64_t>(current.size()) == size->as_int()) {
          out.push_back(Value::MakeList(std::move(current)));
          current.clear();
        }
      }
      if (!current.empty()) out.push_back(Value::MakeList(std::move(current)));
      return Value::MakeList(std::move(out));
    }
  } catch (RenderError& error) {
    if (error.message.rfind("line ", 0) != 0) error.message = At(pos) + ": " + error.message;
    throw;
  }
  Fail(At(pos) + ": unsupported filter '" + name + "'");
}

// Filter and test names are checked once the tree is built, as Jinja does at compile time.
void CheckNames(const Expr& e) {
  if (e.kind == Expr::Kind::kFilter && !Known(std::begin(kFilters), std::end(kFilters), e.name)) {
    throw ParseError{e.pos, "unsupported filter '" + e.name + "'"};
  }
  if (e.kind == Expr::Kind::kTest && !Known(std::begin(kTests), std::end(kTests), e.name)) {
    throw ParseError{e.pos, "unsupported test '" + e.name + "'"};
  }
  for (const ExprPtr& c : e.children) {
    if (c) CheckNames(*c);
  }
  for (const auto& [k, v] : e.kwargs) CheckNames(*v);
}

void CheckNames(const Body& body) {
  for (const NodePtr& node : body) {
    if (node->expr) CheckNames(*node->expr);
    if (node->filter) CheckNames(*node->filter);
    for (const auto& [cond, branch] : node->branches) {
      CheckNames(*cond);
      CheckNames(branch);
    }
    for (const auto& [name, def] : node->params) {
      if (def) CheckNames(*def);
    }
    for (const auto& [name, args] : node->block_filters) {
      if (!Known(std::begin(kFilters), std::end(kFilters), name)) {
        throw ParseError{node->pos, "unsupported filter '" + name + "'"};
      }
      for (const ExprPtr& a : args) CheckNames(*a);
    }
    CheckNames(node->body);
    CheckNames(node->else_body);
  }
}

std::string LocalStrftime(const std::string& format) {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char buf[256];
  const size_t n = std::strftime(buf, sizeof(buf), format.c_str(), &local);
  return std::string(buf, n);
}

void AddGlobals(Scope& globals, const Template::Strftime* strftime) {
  globals.vars["range"] = Value::MakeCallable("range", [](Interp&, Args& args) {
    int64_t start = 0, stop = 0, step = 1;
    for (const Value& v : args.positional) {
      if (!v.is_int() && !v.is_bool())
        Fail("range() integer argument expected, got " + TypeName(v));
    }
    if (args.positional.size() == 1) {
      stop = args.positional[0].as_int();
    } else if (args.positional.size() == 2 || args.positional.size() == 3) {
      start = args.positional[0].as_int();
      stop = args.positional[1].as_int();
      if (args.positional.size() == 3) step = args.positional[2].as_int();
    } else {
      Fail("range expected 1 to 3 arguments");
    }
    if (step == 0) Fail("range() arg 3 must not be zero");
    List items;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (items.size() >= 100000)
        Fail("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
      items.emplace_back(i);
    }
    return Value::MakeList(std::move(items));
  });
  globals.vars["namespace"] = Value::MakeCallable("namespace", [](Interp&, Args& args) {
    Dict attrs;
    for (const Value& v : args.positional) {
      if (!v.is_dict()) Fail("namespace() takes a mapping");
      for (const auto& [k, item] : v.dict()) attrs.emplace_back(k, item);
    }
    for (const auto& [k, v] : args.keyword) attrs.emplace_back(k, v);
    Value ns = Value::MakeDict({}, /*ns=*/true);
    for (auto& [k, v] : attrs) ns.Set(k, v);
    return ns;
  });
  globals.vars["dict"] = Value::MakeCallable("dict", [](Interp&, Args& args) {
    Value d = Value::MakeDict({});
    for (const Value& v : args.positional) {
      if (!v.is_dict()) Fail("dict() takes a mapping here");
      for (const auto& [k, item] : v.dict()) d.Set(k, item);
    }
    for (const auto& [k, v] : args.keyword) d.Set(k, v);
    return d;
  });
  globals.vars["raise_exception"] =
      Value::MakeCallable("raise_exception", [](Interp&, Args& args) -> Value {
        Fail("raise_exception: " +
             (args.positional.empty() ? std::string() : Str(args.positional[0])));
      });
  globals.vars["strftime_now"] = Value::MakeCallable("strftime_now", [strftime](Interp&,
                                                                                Args& args) {
    if (args.positional.empty()) Fail("strftime_now needs a format");
    const std::string format = Str(args.positional[0]);
    return Value(strftime != nullptr && *strftime ? (*strftime)(format) : LocalStrftime(format));
  });
}

}  // namespace

Result<Template> Template::Parse(std::string_view source, std::string_view origin) {
  // Jinja reads "\r\n" and "\r" as "\n" and drops one trailing newline (keep_trailing_newline is
  // off in transformers' environment).
  std::string text;
  text.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      text += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      text += source[i];
    }
  }
  if (!text.empty() && text.back() == '\n') text.pop_back();
  try {
    Lexer lexer(std::move(text));
    Parser parser(lexer.Run());
    auto program = std::make_shared<Program>();
    program->body = parser.ParseTemplate();
    CheckNames(program->body);
    Template t;
    t.program_ = std::move(program);
    return t;
  } catch (const ParseError& error) {
    return Status::InvalidArgument(std::string(origin) + ": " + At(error.pos) + ": " +
                                   error.message);
  }
}

Result<std::string> Template::Render(const nlohmann::ordered_json& variables) const {
  if (!variables.is_object())
    return Status::InvalidArgument("template variables must be a JSON object");
  Scope globals;
  AddGlobals(globals, &strftime_);
  Scope root{{}, &globals};
  for (const auto& [k, v] : variables.items()) root.vars[k] = FromJson(v);
  Interp interp;
  interp.root = &root;
  interp.strftime = &strftime_;
  std::string out;
  try {
    interp.Exec(program_->body, root, out);
  } catch (const RenderError& error) {
    return Status::InvalidArgument(error.message);
  }
  return out;
}

}  // namespace strider::tokenizer::jinja
