// hprun: our torchrun. Starts --nproc-per-node copies of a program with the torchrun environment
// (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT), prefixes
// each output line with its rank, forwards SIGINT/SIGTERM/SIGHUP, and when one rank fails stops
// the others and exits with the status of the first failure, naming that rank. With
// --max-restarts N it starts every rank again instead, up to N times (torchrun's policy: all
// workers restart, each round with a fresh rendezvous, HPRUN_RESTART_COUNT telling which) -
// except when a restart cannot help: the rank that failed first exited with status 2 (usage or
// configuration), or its first "error:" line is the one of the round before (the same bad data,
// the same missing file). --restart-policy always restores torchrun's retry of every failure.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <dirent.h>
#include <sched.h>
#include <sys/mman.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <exception>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

struct Options {
  int nproc = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: pick a free one (single node only)
  double grace_s = 5.0;
  // Pin each local rank to its own share of the cores this launcher may use (DeepSpeed's
  // --bind_cores_to_rank): "auto" pins when there are at least as many cores as local ranks.
  std::string bind_cores = "auto";
  // Namespaces this job's keys in the rendezvous store (torchrun's --rdzv-id), so that ranks of
  // another job pointed at the same MASTER_PORT can never pose as ours. One node: made per job.
  std::string rdzv_id;
  int max_restarts = 0;
  bool restart_always = false;  // --restart-policy always: torchrun's
  std::vector<std::string> cmd;
};

struct Stream {
  int fd = -1;
  std::string pending;
  FILE* sink = nullptr;
};

struct Rank {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;  // exit code (128+signal when killed)
  Stream out, err;
  std::string first_error;  // its first stderr line starting with "error:"
};

volatile sig_atomic_t g_signal = 0;
void on_signal(int sig) { g_signal = sig; }

constexpr const char* kUsage =
    "usage: hprun [--nproc-per-node N] [--nnodes M] [--node-rank R]\n"
    "             [--master-addr A] [--master-port P] [--rdzv-id ID] [--grace-s S] [--bind-cores auto|1|0]\n"
    "             [--max-restarts N] [--restart-policy auto|always]\n"
    "             program [args...]\n";

[[noreturn]] void usage(const char* msg) {
  std::fprintf(stderr, "hprun: %s\n%s", msg, kUsage);
  std::exit(2);
}

int parse_int(const std::string& flag, const char* v, int min) {
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || x < min) usage((flag + " needs an integer >= " + std::to_string(min)).c_str());
  return static_cast<int>(x);
}

Options parse(int argc, char** argv) {
  Options o;
  int i = 1;
  for (; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf("hprun: starts a program on N processes per node with the torchrun environment\n%s", kUsage);
      std::exit(0);
    }
    if (a.rfind("--", 0) != 0) break;
    if (a == "--") { ++i; break; }
    std::string value;
    auto eq = a.find('=');
    std::string flag = a.substr(0, eq);
    for (auto& c : flag) if (c == '_') c = '-';
    if (eq != std::string::npos) value = a.substr(eq + 1);
    else if (i + 1 < argc) value = argv[++i];
    else usage((flag + " needs a value").c_str());
    if (flag == "--nproc-per-node") o.nproc = parse_int(flag, value.c_str(), 1);
    else if (flag == "--nnodes") o.nnodes = parse_int(flag, value.c_str(), 1);
    else if (flag == "--node-rank") o.node_rank = parse_int(flag, value.c_str(), 0);
    else if (flag == "--master-addr") o.master_addr = value;
    else if (flag == "--master-port") {
      o.master_port = parse_int(flag, value.c_str(), 1);
      if (o.master_port > 65535) usage("--master-port needs an integer in 1 .. 65535");
    } else if (flag == "--grace-s") {
      char* end = nullptr;
      o.grace_s = std::strtod(value.c_str(), &end);
      if (end == value.c_str() || *end != '\0' || !(o.grace_s > 0)) usage("--grace-s needs a positive number of seconds");
    }
    else if (flag == "--rdzv-id") o.rdzv_id = value;
    else if (flag == "--max-restarts") o.max_restarts = parse_int(flag, value.c_str(), 0);
    else if (flag == "--restart-policy") {
      if (value != "auto" && value != "always") usage("--restart-policy takes auto (no restart after exit status 2 or the same error twice) or always");
      o.restart_always = value == "always";
    }
    else if (flag == "--bind-cores") {
      if (value != "auto" && value != "1" && value != "0") usage("--bind-cores takes auto, 1 or 0");
      o.bind_cores = value;
    }
    else usage(("unknown option " + flag).c_str());
  }
  for (; i < argc; ++i) o.cmd.emplace_back(argv[i]);
  if (o.cmd.empty()) usage("no program given");
  if (o.node_rank >= o.nnodes) usage("--node-rank must be < --nnodes");
  if (o.master_port == 0 && o.nnodes > 1) usage("--master-port is required with --nnodes > 1");
  // A restart must reach every node's ranks through one rendezvous round; each node's launcher
  // only sees its own ranks, so it cannot restart the job alone.
  if (o.max_restarts > 0 && o.nnodes > 1) usage("--max-restarts needs --nnodes 1: restarts across nodes are not supported yet");
  return o;
}

int free_port(const std::string& addr) {
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = 0;
  if (::inet_pton(AF_INET, addr.c_str(), &sa.sin_addr) != 1) sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof sa;
  if (s < 0 || ::bind(s, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 ||
      ::getsockname(s, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    std::perror("hprun: cannot find a free port");
    std::exit(2);
  }
  int port = ntohs(sa.sin_port);
  ::close(s);
  return port;
}

// Writes complete lines with the rank prefix; keeps a partial last line for later.
void flush_lines(Rank& r, Stream& s, bool final) {
  size_t start = 0, nl;
  while ((nl = s.pending.find('\n', start)) != std::string::npos) {
    if (&s == &r.err && r.first_error.empty() && s.pending.compare(start, 6, "error:") == 0)
      r.first_error = s.pending.substr(start, nl - start);
    std::fprintf(s.sink, "[rank%d]: %.*s\n", r.rank, static_cast<int>(nl - start), s.pending.data() + start);
    start = nl + 1;
  }
  s.pending.erase(0, start);
  if (final && !s.pending.empty()) {
    std::fprintf(s.sink, "[rank%d]: %s\n", r.rank, s.pending.c_str());
    s.pending.clear();
  }
  std::fflush(s.sink);
}

void drain(Rank& r, Stream& s) {
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(s.fd, buf, sizeof buf);
    if (n > 0) { s.pending.append(buf, static_cast<size_t>(n)); continue; }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) break;
    ::close(s.fd);  // EOF or error
    s.fd = -1;
    flush_lines(r, s, true);
    return;
  }
  flush_lines(r, s, false);
}

void signal_all(std::vector<Rank>& ranks, int sig) {
  for (auto& r : ranks)
    if (r.running) ::kill(-r.pid, sig);  // each rank leads its own process group
}

}  // namespace

// The state letter of /proc/<pid>/stat ('R', 'S', 'T' for stopped, ...), or '?'.
char process_state(pid_t pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return '?';
  char buf[512];
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* close = std::strrchr(buf, ')');  // the command name may contain spaces
  return close != nullptr && close[1] == ' ' ? close[2] : '?';
}

// Shared-memory segments of this job that a rank killed at the wrong moment left named.
void remove_job_segments(const std::string& job_id) {
  const std::string prefix = "hp_" + job_id + "_";
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d))
      if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) ::shm_unlink((std::string("/") + e->d_name).c_str());
    ::closedir(d);
  }
}

// The cores to share out when binding: those this process may run on, if there are enough.
std::vector<int> cores_to_bind(const Options& o) {
  std::vector<int> cores;
  if (o.bind_cores == "0") return cores;
  cpu_set_t allowed;
  if (::sched_getaffinity(0, sizeof allowed, &allowed) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &allowed)) cores.push_back(c);
  if (cores.size() < static_cast<size_t>(o.nproc)) {
    if (o.bind_cores == "1")
      std::fprintf(stderr, "hprun: --bind-cores 1: %zu cores for %d ranks; not binding\n", cores.size(), o.nproc);
    cores.clear();
  }
  return cores;
}

// In the forked child: the rank's environment, its cores, then the program (never returns).
[[noreturn]] void exec_rank(const Options& o, int local, int rank, const std::string& job_id, const std::vector<int>& cores,
                            bool set_omp, int restart) {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) signal(sig, SIG_DFL);
  setenv("RANK", std::to_string(rank).c_str(), 1);
  setenv("LOCAL_RANK", std::to_string(local).c_str(), 1);
  setenv("WORLD_SIZE", std::to_string(o.nproc * o.nnodes).c_str(), 1);
  setenv("LOCAL_WORLD_SIZE", std::to_string(o.nproc).c_str(), 1);
  setenv("GROUP_RANK", std::to_string(o.node_rank).c_str(), 1);
  setenv("MASTER_ADDR", o.master_addr.c_str(), 1);
  setenv("MASTER_PORT", std::to_string(o.master_port).c_str(), 1);
  if (set_omp) setenv("OMP_NUM_THREADS", "1", 1);
  setenv("HP_JOB_ID", job_id.c_str(), 1);
  if (!o.rdzv_id.empty()) setenv("HP_RDZV_ID", o.rdzv_id.c_str(), 1);
  setenv("HPRUN_RESTART_COUNT", std::to_string(restart).c_str(), 1);
  setenv("HPRUN_MAX_RESTARTS", std::to_string(o.max_restarts).c_str(), 1);
  if (!cores.empty()) {
    // Local rank i gets the i-th contiguous share of the allowed cores.
    const size_t share = cores.size() / static_cast<size_t>(o.nproc);
    cpu_set_t set;
    CPU_ZERO(&set);
    for (size_t k = 0; k < share; ++k) CPU_SET(cores[static_cast<size_t>(local) * share + k], &set);
    if (::sched_setaffinity(0, sizeof set, &set) != 0) std::perror("hprun: sched_setaffinity");
  }
  std::vector<char*> args;
  for (auto& a : o.cmd) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  ::execvp(args[0], args.data());
  std::fprintf(stderr, "hprun: cannot run %s: %s\n", args[0], std::strerror(errno));
  std::_Exit(127);
}

// Forks local rank `local` with its output on pipes; false (after perror) when it cannot.
bool launch_rank(const Options& o, int local, const std::string& job_id, const std::vector<int>& cores, bool set_omp,
                 int restart, Rank& r) {
  r.rank = o.node_rank * o.nproc + local;
  int out[2], err[2];
  // Close-on-exec: a later rank must not inherit an earlier rank's pipe ends (it would keep
  // that rank's output open after hprun is gone).
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) { std::perror("hprun: pipe"); return false; }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) { std::perror("hprun: fork"); return false; }
  if (pid == 0) {
    // Ranks die with their launcher, even when it is SIGKILLed and cannot forward anything.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) std::_Exit(128 + SIGKILL);  // hprun died before prctl took effect
    ::setpgid(0, 0);
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    ::close(out[0]); ::close(out[1]); ::close(err[0]); ::close(err[1]);
    exec_rank(o, local, r.rank, job_id, cores, set_omp, restart);
  }
  ::setpgid(pid, pid);  // also from the parent, so the group exists before any kill()
  r.pid = pid;
  r.running = true;
  ::close(out[1]);
  ::close(err[1]);
  r.out = {out[0], "", stdout};
  r.err = {err[0], "", stderr};
  ::fcntl(out[0], F_SETFL, O_NONBLOCK);
  ::fcntl(err[0], F_SETFL, O_NONBLOCK);
  return true;
}

// Watches the ranks until all have exited and their output is drained: relays output, forwards
// signals, and when one rank fails stops the others (SIGTERM, SIGKILL after the grace period),
// naming the first failure and any stopped rank.
struct Supervisor {
  const Options& o;
  std::vector<Rank>& ranks;
  int first_failed = -1, first_status = 0, forwarded = 0;
  bool killed_hard = false;
  std::chrono::steady_clock::time_point stop_deadline = std::chrono::steady_clock::time_point::max();

  void stop_in_grace_period() {
    stop_deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o.grace_s * 1000));
  }

  void forward_signal() {
    if (g_signal == 0 || forwarded == g_signal) return;
    forwarded = g_signal;
    std::fprintf(stderr, "hprun: received signal %d, forwarding it to every rank\n", forwarded);
    signal_all(ranks, forwarded);
    if (stop_deadline == std::chrono::steady_clock::time_point::max()) stop_in_grace_period();
  }

  // Relays what is ready (waits up to 50 ms); false when no pipe is open any more.
  bool relay_output() {
    std::vector<pollfd> fds;
    std::vector<std::pair<Rank*, Stream*>> who;
    for (auto& r : ranks)
      for (Stream* s : {&r.out, &r.err})
        if (s->fd >= 0) { fds.push_back({s->fd, POLLIN, 0}); who.emplace_back(&r, s); }
    if (fds.empty()) return false;
    if (::poll(fds.data(), fds.size(), 50) > 0)
      for (size_t k = 0; k < fds.size(); ++k)
        if (fds[k].revents) drain(*who[k].first, *who[k].second);
    return true;
  }

  void on_first_failure(const Rank& r, int st) {
    first_failed = r.rank;
    first_status = r.status;
    if (WIFEXITED(st))
      std::fprintf(stderr, "hprun: rank %d (pid %d) failed first, exit code %d; stopping the other ranks\n", r.rank,
                   static_cast<int>(r.pid), r.status);
    else
      std::fprintf(stderr, "hprun: rank %d (pid %d) failed first, killed by signal %d (%s); stopping the other ranks\n",
                   r.rank, static_cast<int>(r.pid), WTERMSIG(st), strsignal(WTERMSIG(st)));
    // A stopped rank (SIGSTOP, a debugger) cannot fail by itself: name it, it is usually the
    // cause of the others' timeouts.
    for (const auto& other : ranks)
      if (other.running && process_state(other.pid) == 'T')
        std::fprintf(stderr, "hprun: rank %d (pid %d) is stopped (SIGSTOP or a debugger)\n", other.rank,
                     static_cast<int>(other.pid));
    signal_all(ranks, SIGTERM);
    signal_all(ranks, SIGCONT);  // a stopped rank only acts on SIGTERM once continued
    stop_in_grace_period();
  }

  // Reaps the ranks that exited; whether any is still running.
  bool reap() {
    bool any_running = false;
    for (auto& r : ranks) {
      if (!r.running) continue;
      int st = 0;
      if (::waitpid(r.pid, &st, WNOHANG) != r.pid) {
        any_running = true;
        continue;
      }
      r.running = false;
      r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      if (r.status != 0 && first_failed < 0 && forwarded == 0) on_first_failure(r, st);
    }
    if (any_running && !killed_hard && std::chrono::steady_clock::now() > stop_deadline) {
      std::fprintf(stderr, "hprun: ranks still running %.1f s after SIGTERM; sending SIGKILL\n", o.grace_s);
      signal_all(ranks, SIGKILL);
      killed_hard = true;
    }
    return any_running;
  }

  void run() {
    auto drain_deadline = std::chrono::steady_clock::time_point::max();
    for (;;) {
      forward_signal();
      const bool open = relay_output();
      const bool any_running = reap();
      if (any_running) continue;
      if (!open) break;
      // Every rank has exited; a grandchild may still hold a pipe open, so give the rest of the
      // output one second and then stop waiting for it.
      if (drain_deadline == std::chrono::steady_clock::time_point::max())
        drain_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
      if (std::chrono::steady_clock::now() > drain_deadline) break;
    }
  }

  int exit_status() const {
    if (first_failed >= 0) {
      std::fprintf(stderr, "hprun: exiting with rank %d's status %d\n", first_failed, first_status);
      return first_status;
    }
    for (auto& r : ranks)
      if (r.status != 0) return r.status;  // only after a forwarded signal
    return 0;
  }
};

int run(int argc, char** argv) {
  Options o = parse(argc, argv);
  const bool own_port = o.master_port == 0;  // picked here: a restart picks a fresh one
  if (o.master_port == 0) o.master_port = free_port(o.master_addr);
  const bool set_omp = std::getenv("OMP_NUM_THREADS") == nullptr && o.nproc > 1;
  struct sigaction sa{};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &sa, nullptr);

  const std::vector<int> cores = cores_to_bind(o);
  const std::string pid = std::to_string(::getpid());
  const std::string base_rdzv = o.rdzv_id;
  std::string previous_error;  // the first error line of the rank that failed first, last round
  for (int restart = 0;; ++restart) {
    // Each round is a job of its own: its shared-memory names, its rendezvous namespace and (when
    // hprun picked it) its port, so no rank of an earlier round can join this one.
    const std::string job_id = restart == 0 ? pid : pid + "r" + std::to_string(restart);
    if (restart > 0 && own_port) o.master_port = free_port(o.master_addr);
    // One node: this launcher starts every rank, so its own id names the job (with the time: a pid
    // can come back). Several nodes must agree on one: --rdzv-id.
    if (base_rdzv.empty() && o.nnodes == 1)
      o.rdzv_id = job_id + "-" + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
    else if (restart > 0)
      o.rdzv_id = base_rdzv + "-r" + std::to_string(restart);
    std::vector<Rank> ranks(static_cast<size_t>(o.nproc));
    for (int i = 0; i < o.nproc; ++i)
      if (!launch_rank(o, i, job_id, cores, set_omp, restart, ranks[static_cast<size_t>(i)])) {
        signal_all(ranks, SIGKILL);
        return 2;
      }
    Supervisor supervisor{o, ranks};
    supervisor.run();
    remove_job_segments(job_id);
    // A rank's failure restarts the job while restarts are left; a signal from outside does not.
    if (supervisor.first_failed < 0 || supervisor.forwarded != 0 || restart == o.max_restarts) {
      if (supervisor.first_failed >= 0 && o.max_restarts > 0)
        std::fprintf(stderr, "hprun: %d restart(s) used; giving up\n", restart);
      return supervisor.exit_status();
    }
    const std::string& error = ranks[static_cast<size_t>(supervisor.first_failed)].first_error;
    if (!o.restart_always && supervisor.first_status == 2) {
      std::fprintf(stderr, "hprun: rank %d exited with status 2 (a usage or configuration error, which a restart repeats); not "
                   "restarting (--restart-policy always would)\n", supervisor.first_failed);
      return supervisor.exit_status();
    }
    if (!o.restart_always && !error.empty() && error == previous_error) {
      std::fprintf(stderr, "hprun: rank %d failed with the same error as in the round before (%.300s); not restarting "
                   "(--restart-policy always would)\n", supervisor.first_failed, error.c_str());
      return supervisor.exit_status();
    }
    previous_error = error;
    std::fprintf(stderr, "hprun: rank %d failed with status %d; restarting every rank (restart %d of %d)\n", supervisor.first_failed,
                 supervisor.first_status, restart + 1, o.max_restarts);
  }
}

// The launcher's own failures (e.g. out of memory) end as one line and status 1, as the ranks'.
int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hprun: error: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "hprun: error: an exception of unknown type\n");
  }
  return 1;
}
