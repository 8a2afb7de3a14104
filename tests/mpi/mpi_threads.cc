// Prints how many threads each rank has after MPI_Init (and one collective),
// with their names: "rank R threads N: name,name,...", and which PSM2
// library the rank has mapped: "rank R psm2: PATH" (or "none"). The per-rank
// cost of a transport, compared by tests/mpi/run_mtl.sh and run_mpi.sh.
#include <dirent.h>
#include <mpi.h>

#include <cstdio>
#include <fstream>
#include <string>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int sum = rank;
  MPI_Allreduce(MPI_IN_PLACE, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  int count = 0;
  std::string names;
  DIR* tasks = opendir("/proc/self/task");
  while (dirent* task = readdir(tasks)) {
    if (task->d_name[0] == '.') continue;
    std::ifstream comm(std::string("/proc/self/task/") + task->d_name +
                       "/comm");
    std::string name;
    std::getline(comm, name);
    names += (count++ > 0 ? "," : "") + name;
  }
  closedir(tasks);
  printf("rank %d threads %d: %s\n", rank, count, names.c_str());
  std::string psm2 = "none";
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    size_t at = line.find('/');
    if (at != std::string::npos &&
        line.find("/libpsm2.so", at) != std::string::npos) {
      psm2 = line.substr(at);
      break;
    }
  }
  printf("rank %d psm2: %s\n", rank, psm2.c_str());
  MPI_Finalize();
  return 0;
}
