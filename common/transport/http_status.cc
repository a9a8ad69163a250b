#include "common/transport/http_status.h"

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/version.hpp>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>

namespace strider::http {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
using tcp = asio::ip::tcp;

constexpr auto kDeadline = std::chrono::seconds(5);
constexpr size_t kMaxRequestBytes = 8192;

// One connection: read a request, answer it, close.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, const Pages* pages) : stream_(std::move(socket)), pages_(pages) {}

  void Begin() {
    parser_.header_limit(kMaxRequestBytes);
    parser_.body_limit(kMaxRequestBytes);
    stream_.expires_after(kDeadline);
    beast::http::async_read(stream_, buffer_, parser_,
                            [self = shared_from_this()](beast::error_code error, size_t) {
                              self->OnRead(error);
                            });
  }

 private:
  void OnRead(beast::error_code error) {
    if (error == beast::http::error::header_limit || error == beast::http::error::body_limit) {
      Answer(beast::http::status::payload_too_large, "text/plain", "request too large\n", false);
      return;
    }
    if (error) return;  // closed, timed out or malformed: nothing to answer
    const auto& request = parser_.get();
    const bool head = request.method() == beast::http::verb::head;
    if (request.method() != beast::http::verb::get && !head) {
      Answer(beast::http::status::method_not_allowed, "text/plain", "GET or HEAD only\n", false);
      return;
    }
    std::string target(request.target());
    target = target.substr(0, target.find('?'));
    auto found = pages_->find(target);
    if (found == pages_->end()) {
      std::string known;
      for (const auto& [path, make] : *pages_) known += " " + path;
      Answer(beast::http::status::not_found, "text/plain",
             "no page " + target + "; pages:" + known + "\n", head);
      return;
    }
    Page page;
    try {
      page = found->second();
    } catch (const std::exception& e) {
      page = {500, "text/plain", std::string("page failed: ") + e.what() + "\n"};
    }
    Answer(static_cast<beast::http::status>(page.status), page.content_type, page.body, head);
  }

  void Answer(beast::http::status status, const std::string& type, std::string body, bool head) {
    auto response = std::make_shared<beast::http::response<beast::http::string_body>>(status, 11);
    response->set(beast::http::field::server, "strider");
    response->set(beast::http::field::content_type, type);
    response->set(beast::http::field::cache_control, "no-store");
    response->keep_alive(false);
    const size_t length = body.size();
    if (!head) response->body() = std::move(body);
    response->prepare_payload();
    if (head) response->content_length(length);
    beast::http::async_write(stream_, *response,
                             [self = shared_from_this(), response](beast::error_code, size_t) {
                               beast::error_code ignored;
                               self->stream_.socket().shutdown(tcp::socket::shutdown_send,
                                                               ignored);
                             });
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  beast::http::request_parser<beast::http::string_body> parser_;
  const Pages* pages_;
};

class StatusServerImpl : public StatusServer {
 public:
  StatusServerImpl(Pages pages) : pages_(std::move(pages)), acceptor_(context_) {}
  ~StatusServerImpl() override { Stop(); }

  Status Bind(const std::string& bind, const std::string& host, uint16_t port) {
    beast::error_code error;
    const asio::ip::address address = asio::ip::make_address(host, error);
    if (error) {
      return Status::InvalidArgument("http: '" + bind + "': '" + host +
                                     "' is not an IP address (HOST is numeric: 127.0.0.1, 0.0.0.0, [::1])");
    }
    const tcp::endpoint endpoint(address, port);
    acceptor_.open(endpoint.protocol(), error);
    if (!error) acceptor_.set_option(asio::socket_base::reuse_address(true), error);
    if (!error) acceptor_.bind(endpoint, error);
    if (!error) acceptor_.listen(asio::socket_base::max_listen_connections, error);
    if (error) {
      return Status::Unavailable("http: cannot listen on " + bind + ": " + error.message());
    }
    const tcp::endpoint bound = acceptor_.local_endpoint();
    const std::string host_text = bound.address().to_string();
    address_ = (bound.address().is_v6() ? "[" + host_text + "]" : host_text) + ":" +
               std::to_string(bound.port());
    Accept();
    thread_ = std::thread([this] {
      // A failure outside a page function (an allocation, a socket error thrown) must not end
      // the service this thread serves; it ends at most the connection it was on.
      while (true) {
        try {
          context_.run();
          return;
        } catch (const std::exception& e) {
          std::fprintf(stderr, "http %s: %s\n", address_.c_str(), e.what());
        }
      }
    });
    return Status::Ok();
  }

  std::string address() const override { return address_; }

  void Stop() override {
    if (stopped_.exchange(true)) return;
    context_.stop();
    if (thread_.joinable()) thread_.join();
    // With the thread gone the acceptor is this thread's to close: new connections are refused
    // from here on, not left in the listen backlog.
    beast::error_code ignored;
    acceptor_.close(ignored);
  }

 private:
  void Accept() {
    acceptor_.async_accept(asio::make_strand(context_),
                           [this](beast::error_code error, tcp::socket socket) {
                             if (error == asio::error::operation_aborted) return;
                             if (!error) {
                               std::make_shared<Session>(std::move(socket), &pages_)->Begin();
                               Accept();
                               return;
                             }
                             // Out of descriptors, say: retry shortly rather than spin.
                             retry_.expires_after(std::chrono::milliseconds(100));
                             retry_.async_wait([this](beast::error_code waited) {
                               if (!waited) Accept();
                             });
                           });
  }

  const Pages pages_;
  asio::io_context context_{1};
  tcp::acceptor acceptor_;
  asio::steady_timer retry_{context_};
  std::thread thread_;
  std::string address_;
  std::atomic<bool> stopped_{false};
};

std::string ValidName(const std::string& name) {
  std::string out = name.empty() ? "_" : name;
  for (size_t i = 0; i < out.size(); ++i) {
    const char c = out[i];
    const bool ok = std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':' ||
                    (i > 0 && std::isdigit(static_cast<unsigned char>(c)));
    if (!ok) out[i] = '_';
  }
  return out;
}

std::string LabelName(const std::string& name) {
  std::string out = ValidName(name);
  for (char& c : out) c = c == ':' ? '_' : c;
  return out;
}

std::string Escaped(const std::string& value, bool help) {
  std::string out;
  for (const char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && !help) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

std::string Number(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char text[32];
  std::snprintf(text, sizeof(text), "%.17g", value);
  return text;
}

void Flatten(MetricsText* out, const std::string& name, const nlohmann::json& value,
             const MetricsText::Labels& labels) {
  if (value.is_object()) {
    for (const auto& [key, item] : value.items()) Flatten(out, name + "_" + key, item, labels);
  } else if (value.is_array()) {
    // A list of named objects (the replay server's tables): one labelled sample per entry.
    for (const auto& item : value) {
      if (!item.is_object() || !item.contains("name") || !item["name"].is_string()) continue;
      MetricsText::Labels named = labels;
      named.emplace_back("name", item["name"].get<std::string>());
      for (const auto& [key, field] : item.items()) {
        if (key != "name") Flatten(out, name + "_" + key, field, named);
      }
    }
  } else if (value.is_boolean()) {
    out->Add(name, "gauge", "", value.get<bool>() ? 1.0 : 0.0, labels);
  } else if (value.is_number()) {
    out->Add(name, "gauge", "", value.get<double>(), labels);
  }
}

// One GET of AsyncGet: connect, write, read, each under the one deadline set at the start.
class Fetch : public std::enable_shared_from_this<Fetch> {
 public:
  Fetch(asio::io_context& io, std::string address, std::function<void(Result<std::string>)> done)
      : stream_(io), address_(std::move(address)), done_(std::move(done)) {}

  void Begin(const tcp::endpoint& endpoint, const std::string& path,
             std::chrono::milliseconds timeout) {
    request_ = {beast::http::verb::get, path, 11};
    request_.set(beast::http::field::host, address_);
    request_.set(beast::http::field::user_agent, "strider");
    parser_.body_limit(kMaxFetchBytes);
    stream_.expires_after(timeout);
    stream_.async_connect(endpoint, [self = shared_from_this()](beast::error_code error) {
      if (error) return self->Finish(error, "connect");
      beast::http::async_write(self->stream_, self->request_,
                               [self](beast::error_code written, size_t) {
                                 if (written) return self->Finish(written, "write");
                                 self->Read();
                               });
    });
  }

 private:
  static constexpr uint64_t kMaxFetchBytes = 16 << 20;

  void Read() {
    beast::http::async_read(
        stream_, buffer_, parser_, [self = shared_from_this()](beast::error_code error, size_t) {
          if (error) return self->Finish(error, "read");
          beast::error_code ignored;
          self->stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
          const auto& response = self->parser_.get();
          if (response.result_int() != 200) {
            self->done_(Status::Unavailable("http://" + self->address_ +
                                            std::string(self->request_.target()) + ": status " +
                                            std::to_string(response.result_int())));
            return;
          }
          self->done_(std::string(response.body()));
        });
  }

  void Finish(beast::error_code error, const char* what) {
    done_(Status::Unavailable("http://" + address_ + std::string(request_.target()) + ": " + what +
                              ": " + error.message()));
  }

  beast::tcp_stream stream_;
  std::string address_;
  std::function<void(Result<std::string>)> done_;
  beast::http::request<beast::http::empty_body> request_;
  beast::flat_buffer buffer_;
  beast::http::response_parser<beast::http::string_body> parser_;
};

}  // namespace

void AsyncGet(asio::io_context& io, const std::string& address, const std::string& path,
              std::chrono::milliseconds timeout, std::function<void(Result<std::string>)> done) {
  const size_t colon = address.rfind(':');
  std::string host = colon == std::string::npos ? "" : address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  const std::string port_text = colon == std::string::npos ? "" : address.substr(colon + 1);
  beast::error_code error;
  const asio::ip::address ip = asio::ip::make_address(host, error);
  if (error || port_text.empty() || port_text.size() > 5 ||
      port_text.find_first_not_of("0123456789") != std::string::npos ||
      std::stoul(port_text) > 65535) {
    // Through the loop like every other answer, so callers see one order of events.
    asio::post(io, [done = std::move(done), address] {
      done(Status::InvalidArgument("http: '" + address + "' is not a numeric HOST:PORT"));
    });
    return;
  }
  std::make_shared<Fetch>(io, address, std::move(done))
      ->Begin(tcp::endpoint(ip, static_cast<uint16_t>(std::stoul(port_text))), path, timeout);
}

Result<std::unique_ptr<StatusServer>> StatusServer::Start(const std::string& bind, Pages pages) {
  const size_t colon = bind.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == bind.size()) {
    return Status::InvalidArgument("http: '" + bind + "' is not HOST:PORT");
  }
  std::string host = bind.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  const std::string port_text = bind.substr(colon + 1);
  if (port_text.find_first_not_of("0123456789") != std::string::npos || port_text.size() > 5 ||
      std::stoul(port_text) > 65535) {
    return Status::InvalidArgument("http: '" + bind + "': the port must be 0 to 65535");
  }
  auto server = std::make_unique<StatusServerImpl>(std::move(pages));
  STRIDER_RETURN_IF_ERROR(server->Bind(bind, host, static_cast<uint16_t>(std::stoul(port_text))));
  return std::unique_ptr<StatusServer>(std::move(server));
}

void MetricsText::Add(const std::string& name, const std::string& type, const std::string& help,
                      double value, const Labels& labels) {
  std::string valid = ValidName(name);
  // Counters end in _total, as Prometheus's naming rules and its parsers expect.
  if (type == "counter" && !valid.ends_with("_total")) valid += "_total";
  auto [family, added] = families_.try_emplace(valid);
  if (added) {
    order_.push_back(valid);
    family->second.type = type;
    family->second.help = help;
  }
  std::string sample = valid;
  if (!labels.empty()) {
    sample += "{";
    for (size_t i = 0; i < labels.size(); ++i) {
      sample += (i ? "," : "") + LabelName(labels[i].first) + "=\"" +
                Escaped(labels[i].second, false) + "\"";
    }
    sample += "}";
  }
  // Two keys can clean up to one name ("a.b" and "a_b"): the format allows one sample per
  // name and labels, so the first stays.
  if (!family->second.seen.insert(sample).second) return;
  family->second.samples.push_back(sample + " " + Number(value));
}

Status MetricsText::AddJson(const std::string& prefix, const std::string& json,
                            const Labels& labels) {
  const nlohmann::json parsed = nlohmann::json::parse(json, nullptr, false);
  if (!parsed.is_object()) {
    return Status::InvalidArgument("metrics: not a JSON object: " + json.substr(0, 80));
  }
  for (const auto& [key, item] : parsed.items()) Flatten(this, prefix + "_" + key, item, labels);
  return Status::Ok();
}

std::string MetricsText::Text() const {
  std::string text;
  for (const std::string& name : order_) {
    const Family& family = families_.at(name);
    if (!family.help.empty()) text += "# HELP " + name + " " + Escaped(family.help, true) + "\n";
    text += "# TYPE " + name + " " + family.type + "\n";
    for (const std::string& sample : family.samples) text += sample + "\n";
  }
  return text;
}

}  // namespace strider::http
