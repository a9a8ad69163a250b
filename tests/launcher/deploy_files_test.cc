// configs/deploy/ against `strider launch configs/fleet/multinode.yaml --print-commands --json`:
// every manifest parses as YAML, and the Slurm script's srun steps and the Kubernetes
// containers run exactly the printed commands once the scheduler's variables take the fleet's
// values (the first node of a component or a Service name for a host, SLURM_PROCID or the pod
// ordinal for a rank or actor index, the pod name for an actor id).
//
// The commands are expanded by a real shell (bash for srun's steps, sh for the actor
// containers) with `srun` and `strider` on PATH replaced by scripts that print their arguments,
// and Kubernetes' own $(VAR) expansion is applied first, as the kubelet does.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/integration/child_process.h"
#include "tests/scratch_dir.h"

namespace strider::launcher {
namespace {

namespace fs = std::filesystem;
using strider::testing::SourceDir;
using strider::testing::StriderBinary;
using strider::testing::TempDir;
using Argv = std::vector<std::string>;
using Vars = std::map<std::string, std::string>;

struct Printed {
  std::string host, role, name;
  Argv argv;
};

struct Ran {
  int status = -1;
  std::string out;
};

// Runs `argv` (found on this process's PATH) in `cwd`, with `env` as its whole environment or,
// when null, this process's; returns its exit status and stdout.
Ran Run(const Argv& argv, const Vars* env, const std::string& cwd = "") {
  Ran ran;
  int fds[2];
  if (::pipe(fds) != 0) return ran;
  std::vector<std::string> entries;
  if (env != nullptr) {
    for (const auto& [name, value] : *env) entries.push_back(name + "=" + value);
  }
  std::vector<char*> args, envp;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  for (std::string& entry : entries) envp.push_back(entry.data());
  envp.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fds[1], STDOUT_FILENO);
    ::close(fds[0]);
    ::close(fds[1]);
    if (!cwd.empty() && ::chdir(cwd.c_str()) != 0) ::_exit(126);
    if (env != nullptr) {
      ::execvpe(args[0], args.data(), envp.data());
    } else {
      ::execvp(args[0], args.data());
    }
    ::_exit(127);
  }
  ::close(fds[1]);
  char chunk[4096];
  for (ssize_t n; (n = ::read(fds[0], chunk, sizeof(chunk))) > 0;) ran.out.append(chunk, n);
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ran.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return ran;
}

Argv SplitNul(const std::string& text) {
  Argv words;
  size_t start = 0;
  for (size_t end; (end = text.find('\0', start)) != std::string::npos; start = end + 1) {
    words.push_back(text.substr(start, end - start));
  }
  return words;
}

std::string Joined(const Argv& argv) {
  std::string line;
  for (const std::string& arg : argv) line += (line.empty() ? "" : " ") + arg;
  return line;
}

// What --print-commands gives for `fleet`, run from the repository root.
std::vector<Printed> PrintCommands(const std::string& fleet) {
  const Ran ran =
      Run({StriderBinary(), "launch", fleet, "--print-commands", "--json"}, nullptr, SourceDir());
  EXPECT_EQ(ran.status, 0) << "strider launch --print-commands failed";
  std::vector<Printed> printed;
  std::istringstream lines(ran.out);
  for (std::string line; std::getline(lines, line);) {
    const nlohmann::json command = nlohmann::json::parse(line);
    printed.push_back(
        {command["host"], command["role"], command["name"], command["argv"].get<Argv>()});
  }
  return printed;
}

// `srun` and `strider` that print their arguments, NUL-separated (strider its name first).
class FakeCommands {
 public:
  FakeCommands() {
    fs::create_directories(dir_.Sub("bin"));
    Write("srun", "printf '%s\\0' \"$@\"\n");
    Write("strider", "printf '%s\\0' \"$(basename \"$0\")\" \"$@\"\n");
  }
  std::string path() const { return dir_.Sub("bin") + ":/usr/bin:/bin"; }

 private:
  void Write(const std::string& name, const std::string& body) {
    const std::string path = dir_.Sub("bin/" + name);
    std::ofstream(path) << "#!/bin/sh\n" << body;
    fs::permissions(path, fs::perms::owner_all);
  }
  TempDir dir_;
};

// One command a deploy file runs: the role's index-th instance (a learner rank, an actor index).
struct Instance {
  std::string where;  // for messages: the file and the task or pod
  int64_t index = 0;
  int64_t node = -1;  // Slurm: the component's node it runs on
  Argv argv;
};

// The role a command runs: replay, learner or actor.
std::string RoleOf(const Argv& argv) { return argv.size() > 1 ? argv[1] : "?"; }

int64_t IndexOf(const Printed& command) {
  const size_t dash = command.name.rfind('-');
  return dash == std::string::npos ? 0 : std::stoll(command.name.substr(dash + 1));
}

// Differences between the instances a deploy file runs and the printed commands, per role.
void Compare(const std::string& what, std::map<std::string, std::vector<Instance>> instances,
             const std::vector<Printed>& printed, std::vector<std::string>* problems) {
  std::map<std::string, std::vector<Printed>> wanted;
  for (const Printed& command : printed) wanted[command.role].push_back(command);
  for (auto& [role, commands] : wanted) {
    std::sort(commands.begin(), commands.end(),
              [](const Printed& a, const Printed& b) { return IndexOf(a) < IndexOf(b); });
    std::vector<Instance>& ran = instances[role];
    std::sort(ran.begin(), ran.end(),
              [](const Instance& a, const Instance& b) { return a.index < b.index; });
    if (ran.size() != commands.size()) {
      problems->push_back(what + ": " + std::to_string(ran.size()) + " " + role +
                          " commands, --print-commands gives " + std::to_string(commands.size()));
      continue;
    }
    std::vector<std::string> hosts;  // the role's hosts in the order its instances fill them
    for (const Printed& command : commands) {
      if (std::find(hosts.begin(), hosts.end(), command.host) == hosts.end()) {
        hosts.push_back(command.host);
      }
    }
    for (size_t i = 0; i < commands.size(); ++i) {
      if (ran[i].argv != commands[i].argv) {
        problems->push_back(ran[i].where + " runs\n    " + Joined(ran[i].argv) +
                            "\n  --print-commands gives " + commands[i].name + ":\n    " +
                            Joined(commands[i].argv));
      }
      if (ran[i].node >= 0 && (ran[i].node >= static_cast<int64_t>(hosts.size()) ||
                               hosts[static_cast<size_t>(ran[i].node)] != commands[i].host)) {
        problems->push_back(ran[i].where + " runs on the component's node " +
                            std::to_string(ran[i].node) + ", where the fleet has " +
                            commands[i].name + " on " + commands[i].host);
      }
    }
  }
  for (const auto& [role, ran] : instances) {
    if (!wanted.count(role)) problems->push_back(what + ": runs '" + role + "', no fleet role");
  }
}

// The values the fleet gives what the schedulers name: the replay host and learner rank 0's.
Vars HostValues(const std::vector<Printed>& printed) {
  Vars values;
  for (const Printed& command : printed) {
    if (command.role == "replay") values["STRIDER_REPLAY_HOST"] = command.host;
    if (command.name == "learner-0" || command.name == "learner") {
      values["STRIDER_LEARNER_HOST"] = command.host;
    }
  }
  return values;
}

// ---- Slurm ----

struct Component {
  int64_t nodes = 1;
  int64_t tasks_per_node = 1;
};

void CheckSlurm(const std::string& path, const std::vector<Printed>& printed,
                std::vector<std::string>* problems) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  // #SBATCH options, a component per `hetjob`.
  std::vector<Component> components(1);
  for (const std::string& line : lines) {
    if (line.rfind("#SBATCH", 0) != 0) continue;
    std::istringstream words(line.substr(7));
    for (std::string word; words >> word;) {
      if (word == "hetjob") components.emplace_back();
      if (word.rfind("--nodes=", 0) == 0) components.back().nodes = std::stoll(word.substr(8));
      if (word.rfind("--ntasks-per-node=", 0) == 0) {
        components.back().tasks_per_node = std::stoll(word.substr(18));
      }
    }
  }
  // Each srun line with its continuation lines, as the batch shell reads it.
  std::vector<std::string> steps;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].rfind("srun ", 0) != 0) continue;
    std::string step = lines[i];
    while (!step.empty() && step.back() == '\\' && i + 1 < lines.size()) step += "\n" + lines[++i];
    while (!step.empty() && (step.back() == '&' || step.back() == ' ')) step.pop_back();
    steps.push_back(step);
  }
  if (steps.empty()) problems->push_back(path + ": no srun lines");

  FakeCommands fake;
  const Vars hosts = HostValues(printed);
  std::map<std::string, std::vector<Instance>> instances;
  for (const std::string& step : steps) {
    Vars env = hosts;
    env["PATH"] = fake.path();
    const Ran srun = Run({"bash", "-c", step}, &env);
    const Argv args = SplitNul(srun.out);
    size_t at = 0;
    int64_t group = -1;
    for (; at < args.size() && args[at].rfind("-", 0) == 0; ++at) {
      if (args[at].rfind("--het-group=", 0) == 0) group = std::stoll(args[at].substr(12));
    }
    if (group < 0 || group >= static_cast<int64_t>(components.size()) || at == args.size()) {
      problems->push_back(path +
                          ": an srun line without --het-group=N of a component and a "
                          "command:\n" +
                          step);
      continue;
    }
    const Component& component = components[static_cast<size_t>(group)];
    const Argv command(args.begin() + static_cast<std::ptrdiff_t>(at), args.end());
    const int64_t tasks = component.nodes * component.tasks_per_node;
    for (int64_t task = 0; task < tasks; ++task) {
      Vars task_env = env;
      task_env["SLURM_PROCID"] = std::to_string(task);
      task_env["SLURM_NTASKS"] = std::to_string(tasks);
      task_env["SLURM_NODEID"] = std::to_string(task / component.tasks_per_node);
      task_env["SLURM_LOCALID"] = std::to_string(task % component.tasks_per_node);
      const Ran ran = Run(command, &task_env);
      Instance instance;
      instance.where =
          path + " het-group " + std::to_string(group) + " task " + std::to_string(task);
      instance.index = task;
      instance.node = task / component.tasks_per_node;  // srun's default block distribution
      instance.argv = SplitNul(ran.out);
      if (ran.status != 0) {
        problems->push_back(instance.where + ": its command failed (" + std::to_string(ran.status) +
                            ")");
      }
      instances[RoleOf(instance.argv)].push_back(instance);
    }
  }
  Compare(path, instances, printed, problems);
}

// ---- Kubernetes ----

// $(VAR) as the kubelet expands command and args: a declared variable's value, $$ for $, and
// anything else left as written.
std::string KubeExpand(const std::string& text, const Vars& declared) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '$' && i + 1 < text.size() && text[i + 1] == '$') {
      out += '$';
      ++i;
    } else if (text[i] == '$' && i + 1 < text.size() && text[i + 1] == '(') {
      const size_t close = text.find(')', i + 2);
      if (close == std::string::npos) {
        out += text.substr(i);
        break;
      }
      const std::string name = text.substr(i + 2, close - i - 2);
      auto found = declared.find(name);
      out += found != declared.end() ? found->second : "$(" + name + ")";
      i = close;
    } else {
      out += text[i];
    }
  }
  return out;
}

Argv Strings(const YAML::Node& list) {
  Argv out;
  if (list && list.IsSequence()) {
    for (const YAML::Node& item : list) out.push_back(item.as<std::string>());
  }
  return out;
}

bool Matches(const YAML::Node& selector, const YAML::Node& labels) {
  if (!selector || !selector.IsMap() || selector.size() == 0 || !labels) return false;
  for (const auto& pair : selector) {
    const YAML::Node label = labels[pair.first.as<std::string>()];
    if (!label || label.as<std::string>() != pair.second.as<std::string>()) return false;
  }
  return true;
}

std::set<int64_t> PortsOf(const YAML::Node& service) {
  std::set<int64_t> ports;
  for (const YAML::Node& port : service["spec"]["ports"]) ports.insert(port["port"].as<int64_t>());
  return ports;
}

// The port of a tcp://HOST:PORT or HOST:PORT argument after `flag` in `argv`.
int64_t PortAfter(const Argv& argv, const std::string& flag) {
  auto at = std::find(argv.begin(), argv.end(), flag);
  if (at == argv.end() || at + 1 == argv.end()) return -1;
  return std::stoll((at + 1)->substr((at + 1)->rfind(':') + 1));
}

void CheckKubernetes(const std::string& dir, const std::vector<Printed>& printed,
                     std::vector<std::string>* problems) {
  std::vector<std::pair<std::string, YAML::Node>> documents;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".yaml") continue;
    for (const YAML::Node& document : YAML::LoadAllFromFile(entry.path().string())) {
      documents.emplace_back(entry.path().filename().string(), document);
    }
  }
  FakeCommands fake;
  const Vars hosts = HostValues(printed);
  std::map<std::string, std::vector<Instance>> instances;
  std::map<std::string, std::pair<std::string, YAML::Node>> workload_of;  // role -> workload
  for (const auto& [file, document] : documents) {
    const std::string kind = document["kind"].as<std::string>();
    if (kind != "Deployment" && kind != "StatefulSet") continue;
    const YAML::Node spec = document["spec"];
    const int64_t replicas = spec["replicas"] ? spec["replicas"].as<int64_t>() : 1;
    for (const YAML::Node& container : spec["template"]["spec"]["containers"]) {
      const auto expanded = [&](int64_t i, const std::string& pod_name, std::string* failure) {
        Vars bound = hosts;
        bound["STRIDER_RANK"] = std::to_string(i);
        bound["ACTOR_INDEX"] = std::to_string(i);
        bound["POD_NAME"] = pod_name;
        Vars declared;
        for (const YAML::Node& var : container["env"]) {
          const std::string name = var["name"].as<std::string>();
          if (bound.count(name)) {
            declared[name] = bound[name];
          } else if (var["value"]) {
            declared[name] = var["value"].as<std::string>();
          } else {
            *failure = "env " + name + " comes from the cluster and the test has no value for it";
          }
        }
        Argv argv = Strings(container["command"]);
        for (const std::string& arg : Strings(container["args"])) argv.push_back(arg);
        for (std::string& arg : argv) arg = KubeExpand(arg, declared);
        if (argv.size() >= 2 && (argv[0] == "/bin/sh" || argv[0] == "sh") && argv[1] == "-c") {
          Vars env = bound;
          for (const auto& [name, value] : declared) env[name] = value;
          env["PATH"] = fake.path();
          const Ran ran = Run(argv, &env);
          if (ran.status != 0) *failure = "its shell command failed";
          return SplitNul(ran.out);
        }
        return argv;
      };
      std::string failure;
      const std::string role = RoleOf(expanded(0, "", &failure));
      std::vector<Printed> of_role;
      for (const Printed& command : printed) {
        if (command.role == role) of_role.push_back(command);
      }
      std::sort(of_role.begin(), of_role.end(),
                [](const Printed& a, const Printed& b) { return IndexOf(a) < IndexOf(b); });
      workload_of[role] = {file, document};
      for (int64_t i = 0; i < replicas; ++i) {
        Instance instance;
        instance.where = file + " " + kind + " " + document["metadata"]["name"].as<std::string>() +
                         " pod " + std::to_string(i);
        instance.index = i;
        instance.argv = expanded(
            i, i < static_cast<int64_t>(of_role.size()) ? of_role[static_cast<size_t>(i)].name : "",
            &failure);
        if (!failure.empty()) problems->push_back(instance.where + ": " + failure);
        instances[role].push_back(instance);
      }
    }
  }
  Compare(dir, instances, printed, problems);

  // Learner ranks need stable ordinals and a headless Service for rendezvous and weights; the
  // replay server a Service with its two ports; actors are a Deployment.
  const auto service =
      [&](const std::function<bool(const YAML::Node&)>& wanted) -> std::optional<YAML::Node> {
    for (const auto& [file, document] : documents) {
      if (document["kind"].as<std::string>() == "Service" && wanted(document)) return document;
    }
    return std::nullopt;
  };
  const auto printed_of = [&](const std::string& role) -> const Printed* {
    for (const Printed& command : printed) {
      if (command.role == role) return &command;
    }
    return nullptr;
  };
  if (workload_of.count("learner") && printed_of("learner")) {
    const YAML::Node learner = workload_of["learner"].second;
    const std::string name =
        learner["spec"]["serviceName"] ? learner["spec"]["serviceName"].as<std::string>() : "";
    const std::optional<YAML::Node> headless = service([&](const YAML::Node& s) {
      return s["metadata"]["name"].as<std::string>() == name && s["spec"]["clusterIP"] &&
             s["spec"]["clusterIP"].as<std::string>() == "None";
    });
    if (learner["kind"].as<std::string>() != "StatefulSet" || !headless) {
      problems->push_back(dir +
                          ": learner ranks need a StatefulSet whose serviceName is a "
                          "headless Service (clusterIP: None)");
    } else {
      const Argv& argv = printed_of("learner")->argv;
      for (const std::string flag : {"--rendezvous", "--publish"}) {
        if (argv.size() > 0 && std::find(argv.begin(), argv.end(), flag) != argv.end() &&
            !PortsOf(*headless).count(PortAfter(argv, flag))) {
          problems->push_back(dir + ": Service " + name + " lacks the port of the learner's " +
                              flag + " " + std::to_string(PortAfter(argv, flag)));
        }
      }
    }
  }
  if (workload_of.count("replay") && printed_of("replay")) {
    const YAML::Node labels =
        workload_of["replay"].second["spec"]["template"]["metadata"]["labels"];
    const std::optional<YAML::Node> replay =
        service([&](const YAML::Node& s) { return Matches(s["spec"]["selector"], labels); });
    if (!replay) {
      problems->push_back(dir + ": no Service selects the replay server's pods");
    } else {
      for (const std::string flag : {"--bind", "--sample-bind"}) {
        const int64_t port = PortAfter(printed_of("replay")->argv, flag);
        if (!PortsOf(*replay).count(port)) {
          problems->push_back(dir + ": the replay Service lacks " + flag + "'s port " +
                              std::to_string(port));
        }
      }
    }
  }
  if (workload_of.count("actor") &&
      workload_of["actor"].second["kind"].as<std::string>() != "Deployment") {
    problems->push_back(dir + ": actors run as a Deployment");
  }
}

std::vector<std::string> DeployProblems(const std::string& deploy,
                                        const std::vector<Printed>& printed) {
  std::vector<std::string> problems;
  CheckSlurm(deploy + "/slurm/strider.sbatch", printed, &problems);
  CheckKubernetes(deploy + "/kubernetes", printed, &problems);
  return problems;
}

std::string Listed(const std::vector<std::string>& problems) {
  std::string out;
  for (const std::string& problem : problems) out += problem + "\n";
  return out;
}

std::string Fleet() { return SourceDir() + "/configs/fleet/multinode.yaml"; }
std::string Deploy() { return SourceDir() + "/configs/deploy"; }

TEST(DeployFiles, EveryManifestParsesAsYaml) {
  size_t manifests = 0;
  for (const auto& entry : fs::recursive_directory_iterator(Deploy())) {
    const std::string extension = entry.path().extension().string();
    if (extension != ".yaml" && extension != ".yml") continue;
    std::vector<YAML::Node> documents;
    try {
      documents = YAML::LoadAllFromFile(entry.path().string());
    } catch (const YAML::Exception& error) {
      ADD_FAILURE() << entry.path() << ": " << error.what();
      continue;
    }
    ++manifests;
    EXPECT_FALSE(documents.empty()) << entry.path();
    for (const YAML::Node& document : documents) {
      EXPECT_TRUE(document.IsMap() && document["apiVersion"] && document["kind"] &&
                  document["metadata"]["name"])
          << entry.path() << ": a Kubernetes object has apiVersion, kind and metadata.name";
    }
  }
  EXPECT_GE(manifests, 4u) << "storage, replay, learner and actor manifests";
}

TEST(DeployFiles, CarryTheCommandsPrintCommandsGives) {
  const std::vector<Printed> printed = PrintCommands(Fleet());
  ASSERT_EQ(printed.size(), 7u) << "one replay server, two learner ranks, four actors";
  const std::vector<std::string> problems = DeployProblems(Deploy(), printed);
  EXPECT_TRUE(problems.empty()) << Listed(problems);
}

// A copy of configs/deploy with `from` replaced by `to` in one file.
std::string EditedCopy(const TempDir& dir, const std::string& file, const std::string& from,
                       const std::string& to) {
  const std::string copy = dir.Sub("deploy");
  fs::copy(Deploy(), copy, fs::copy_options::recursive);
  std::ifstream in(copy + "/" + file);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from << " not in " << file;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  std::ofstream(copy + "/" + file) << text;
  return copy;
}

TEST(DeployFiles, AnEditInOnePlaceOnlyIsCaught) {
  const std::vector<Printed> printed = PrintCommands(Fleet());
  const struct {
    std::string file, from, to;
  } edits[] = {
      {"slurm/strider.sbatch", "--episodes 0", "--episodes 1"},
      {"slurm/strider.sbatch", "--max-steps 2000", "--max-steps 2001"},
      {"slurm/strider.sbatch", "--nodes=2 --ntasks-per-node=2", "--nodes=1 --ntasks-per-node=4"},
      {"slurm/strider.sbatch", "\"$((1 + SLURM_PROCID))\"", "\"$((2 + SLURM_PROCID))\""},
      {"kubernetes/learner.yaml", "- \"2000\"", "- \"2001\""},
      {"kubernetes/learner.yaml", "replicas: 2", "replicas: 3"},
      {"kubernetes/learner.yaml", "clusterIP: None", "type: ClusterIP"},
      {"kubernetes/actors.yaml", "--no-progress \\\n", ""},
      {"kubernetes/replay.yaml", "- tcp://0.0.0.0:5556", "- tcp://0.0.0.0:5558"},
      {"kubernetes/replay.yaml", "{name: learner, port: 5556, targetPort: 5556}",
       "{name: learner, port: 5558, targetPort: 5558}"},
  };
  for (const auto& edit : edits) {
    TempDir dir;
    const std::vector<std::string> problems =
        DeployProblems(EditedCopy(dir, edit.file, edit.from, edit.to), printed);
    EXPECT_FALSE(problems.empty()) << edit.file << ": " << edit.from << " -> " << edit.to;
  }

  // The fleet edited alone: its own commands no longer match the deploy files.
  TempDir dir;
  std::ifstream in(Fleet());
  std::string text((std::istreambuf_iterator<char>(in)), {});
  text.replace(text.find("learner_steps: 2000"), 19, "learner_steps: 2500");
  std::ofstream(dir.Sub("multinode.yaml")) << text;
  const std::vector<Printed> edited = PrintCommands(dir.Sub("multinode.yaml"));
  ASSERT_EQ(edited.size(), printed.size());
  const std::vector<std::string> problems = DeployProblems(Deploy(), edited);
  EXPECT_FALSE(problems.empty());
  EXPECT_NE(Listed(problems).find("--max-steps 2500"), std::string::npos) << Listed(problems);
}

}  // namespace
}  // namespace strider::launcher
