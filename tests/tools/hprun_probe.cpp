// A program for hprun's own tests: behaves according to its first argument.
//   env                  print the launch environment
//   exit-on-rank R CODE  rank R exits with CODE at once, the others wait to be stopped
//   never-joins R        rank R never joins; the others try to and must fail with a timeout
//   stop-in-collective R rank R stops itself (SIGSTOP) before an all_reduce the others enter
//   exit-in-collective R rank R exits before an all_reduce the others enter
//   same-error           rank 1 prints "error: the same failure every time" and exits 1
//   fail-until-restart R K  prints its round (HPRUN_RESTART_COUNT) and port; rank R exits with 5
//                        while the round is below K, then every rank sums over the job
//   late-sum D0 D1       rank 0 starts after D0 ms, the others after D1 ms; then 20 all_reduces
//                        of (rank + 1) checked against the job's own sum; prints this job's id
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include <csignal>

#include <ATen/ATen.h>

#include <hyper_parallel/runtime/collectives.h>
#include <hyper_parallel/mesh/device_mesh.h>
#include <hyper_parallel/runtime/process_group.h>

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "env";
  const int rank = std::atoi(std::getenv("RANK") ? std::getenv("RANK") : "-1");
  if (mode == "env") {
    std::printf("rank %d local_rank %s world %s omp %s\n", rank, std::getenv("LOCAL_RANK"),
                std::getenv("WORLD_SIZE"), std::getenv("OMP_NUM_THREADS"));
    return 0;
  }
  if (mode == "exit-on-rank" && argc > 3) {
    if (rank == std::atoi(argv[2])) return std::atoi(argv[3]);
    std::this_thread::sleep_for(std::chrono::seconds(60));
    return 0;
  }
  if (mode == "never-joins" && argc > 2) {
    if (rank == std::atoi(argv[2])) {
      std::this_thread::sleep_for(std::chrono::seconds(60));
      return 0;
    }
    try {
      hyper_parallel::init_process_group();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
      return 1;
    }
    return 0;
  }
  if (mode == "fail-until-restart" && argc > 3) {
    namespace hp = hyper_parallel;
    const char* count = std::getenv("HPRUN_RESTART_COUNT");
    const int round = std::atoi(count ? count : "-1");
    std::printf("round %d port %s rdzv %s\n", round, std::getenv("MASTER_PORT"), std::getenv("HP_RDZV_ID"));
    std::fflush(stdout);
    if (rank == std::atoi(argv[2]) && round < std::atoi(argv[3])) return 5;
    hp::init_process_group();
    at::Tensor t = at::full({1}, 1.0);
    hp::all_reduce_(t, hp::ReduceOp::SUM, hp::world_group());
    std::printf("round %d: %g ranks joined\n", round, t[0].item<double>());
    return 0;
  }
  if (mode == "late-sum" && argc > 3) {
    namespace hp = hyper_parallel;
    std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(argv[rank == 0 ? 2 : 3])));
    hp::init_process_group();
    const int64_t n = hp::get_world_size();
    for (int i = 0; i < 20; ++i) {
      at::Tensor t = at::full({4}, static_cast<double>(rank + 1));
      hp::all_reduce_(t, hp::ReduceOp::SUM, hp::world_group());
      if (t[0].item<double>() != static_cast<double>(n * (n + 1) / 2)) {
        std::printf("rank %d: wrong sum %g\n", rank, t[0].item<double>());
        return 4;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    std::printf("rank %d of job %s: sums right\n", rank, std::getenv("HP_JOB_ID"));
    return 0;
  }
  if (mode == "same-error") {  // rank 1 fails the same way in every round
    if (rank == 1) {
      std::fprintf(stderr, "error: the same failure every time\n");
      return 1;
    }
    return 0;
  }
  if (mode == "mismatched-all-reduce") {  // rank 0 reduces 4 elements, the others 8
    namespace hp = hyper_parallel;
    hp::init_process_group();
    at::Tensor t = at::ones({rank == 0 ? 4 : 8});
    try {
      hp::all_reduce_(t, hp::ReduceOp::SUM, hp::world_group());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank %d raised: %.300s\n", rank, e.what());  // unbuffered: hprun may stop us soon
      return 3;
    }
    std::printf("rank %d returned\n", rank);
    return 0;
  }
  if (mode == "mismatched-kinds") {  // rank 0 all_reduces, the others all_gather
    namespace hp = hyper_parallel;
    hp::init_process_group();
    try {
      if (rank == 0) {
        at::Tensor t = at::ones({4});
        hp::all_reduce_(t, hp::ReduceOp::SUM, hp::world_group());
      } else {
        hp::all_gather(at::ones({2}), 0, hp::world_group());
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank %d raised: %.600s\n", rank, e.what());
      return 3;
    }
    std::printf("rank %d returned\n", rank);
    return 0;
  }
  if (mode == "transports") {  // a 2-D mesh (dp, tp) over the whole job: who carries what
    namespace hp = hyper_parallel;
    hp::init_process_group();
    const int64_t ws = hp::get_world_size();
    auto mesh = hp::init_device_mesh("cpu", {2, ws / 2}, {"dp", "tp"});
    std::printf("rank %d world=%s dp=%s tp=%s\n", rank, hp::world_group().transport().c_str(),
                mesh.get_group(0).transport().c_str(), mesh.get_group(1).transport().c_str());
    at::Tensor t = at::full({4}, static_cast<double>(rank));
    hp::all_reduce_(t, hp::ReduceOp::SUM, hp::world_group());
    std::printf("rank %d sum=%g\n", rank, t[0].item<double>());
    return 0;
  }
  if ((mode == "stop-in-collective" || mode == "exit-in-collective") && argc > 2) {
    namespace hp = hyper_parallel;
    try {
      hp::init_process_group();
      at::Tensor t = at::ones({4});
      hp::all_reduce_(t, hp::ReduceOp::SUM, hp::world_group());  // everyone is here once
      if (rank == std::atoi(argv[2])) {
        if (mode == "stop-in-collective") std::raise(SIGSTOP);
        std::_Exit(0);  // gone without a word
      }
      hp::all_reduce_(t, hp::ReduceOp::SUM, hp::world_group());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
      return 1;
    }
    return 0;
  }
  std::fprintf(stderr, "hprun_probe: bad arguments\n");
  return 2;
}
