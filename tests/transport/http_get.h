// Test helpers for the services' HTTP pages: a plain-socket HTTP/1.1 client (nothing shared
// with the server's Beast code) and Debian's Prometheus parser (python3-prometheus-client) as
// the independent reader of /metrics.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace strider::testing {

struct HttpReply {
  int status = 0;  // 0: no reply
  std::string headers;
  std::string body;
};

// Sends `request` verbatim to 127.0.0.1:port and reads until the server closes.
inline HttpReply RawHttp(int port, const std::string& request) {
  HttpReply reply;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval timeout{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    ::close(fd);
    return reply;
  }
  for (size_t sent = 0; sent < request.size();) {
    const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  std::string raw;
  char chunk[65536];
  for (ssize_t n; (n = ::recv(fd, chunk, sizeof(chunk), 0)) > 0;) raw.append(chunk, n);
  ::close(fd);
  const size_t end = raw.find("\r\n\r\n");
  if (raw.rfind("HTTP/1.1 ", 0) != 0 || end == std::string::npos) return reply;
  reply.status = std::atoi(raw.c_str() + 9);
  reply.headers = raw.substr(0, end);
  reply.body = raw.substr(end + 4);
  return reply;
}

inline HttpReply HttpGet(int port, const std::string& path) {
  return RawHttp(port, "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
}

// The port of "HOST:PORT".
inline int PortOf(const std::string& address) {
  return std::atoi(address.c_str() + address.rfind(':') + 1);
}

// Parses Prometheus text with prometheus_client.parser; returns {"name{labels as sorted JSON}":
// value} for every sample, or an object {"error": "..."} when it does not parse.
inline nlohmann::json ParsePrometheus(const std::string& text, const std::string& scratch) {
  const std::string input = scratch + ".prom";
  std::ofstream(input) << text;
  const std::string command =
      "/usr/bin/python3 -c '"
      "import sys, json\n"
      "from prometheus_client.parser import text_string_to_metric_families as families\n"
      "try:\n"
      "  out = {s.name + json.dumps(s.labels, sort_keys=True): s.value"
      " for f in families(sys.stdin.read()) for s in f.samples}\n"
      "except Exception as e:\n"
      "  out = {\"error\": repr(e)}\n"
      "print(json.dumps(out))' < " + input + " 2>&1";
  std::string output;
  if (FILE* pipe = ::popen(command.c_str(), "r")) {
    char buffer[4096];
    for (size_t n; (n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0;) output.append(buffer, n);
    ::pclose(pipe);
  }
  std::remove(input.c_str());
  nlohmann::json parsed = nlohmann::json::parse(output, nullptr, false);
  if (!parsed.is_object()) return {{"error", "the parser printed: " + output}};
  return parsed;
}

}  // namespace strider::testing
