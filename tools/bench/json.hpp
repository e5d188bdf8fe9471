// A flat JSON object writer: fields in insertion order, non-finite numbers as null.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace fa_bench {

class JsonObject {
 public:
  JsonObject& number(std::string_view key, double v) {
    if (!std::isfinite(v)) return null(key);
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.6g", v);
    return raw(key, buf);
  }
  JsonObject& integer(std::string_view key, int64_t v) { return raw(key, std::to_string(v)); }
  JsonObject& boolean(std::string_view key, bool v) { return raw(key, v ? "true" : "false"); }
  JsonObject& null(std::string_view key) { return raw(key, "null"); }
  JsonObject& string(std::string_view key, std::string_view v) { return raw(key, quote(v)); }
  // value must already be valid JSON (an array or object built elsewhere).
  JsonObject& raw(std::string_view key, std::string_view value) {
    body_ += body_.empty() ? "" : ", ";
    body_ += quote(key);
    body_ += ": ";
    body_ += value;
    return *this;
  }
  std::string str() const { return "{" + body_ + "}"; }

  static std::string quote(std::string_view s) {
    std::string out = "\"";
    for (const char c : s) {
      if (c == '"' || c == '\\') {
        out += '\\';
        out += c;
      } else if (static_cast<unsigned char>(c) < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", c);
        out += buf;
      } else {
        out += c;
      }
    }
    return out + "\"";
  }

 private:
  std::string body_;
};

}  // namespace fa_bench
