// Non-contiguous MPI datatypes (vector, indexed, struct) sent between two
// ranks at sizes on both sides of the eager/rendezvous threshold, checked
// byte by byte against a type map computed here, independently of MPI's
// packing: every data byte lands where the map says, every gap byte is left
// untouched. Each case goes typed -> typed, typed -> bytes and bytes -> typed,
// with blocking and nonblocking calls. Prints one PASS/FAIL line per case and
// exits non-zero on any failure.
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace {

// psmd's default rendezvous threshold (client/mq_options.h): packed sizes
// around it cross from eager to rendezvous.
constexpr int kRendezvousBytes = 64000;
constexpr uint8_t kGap = 0xee;

struct Segment {
  long offset;
  long length;
};

// A datatype with its map: the byte segments of one element and its extent.
struct Layout {
  std::string name;
  MPI_Datatype type;
  std::vector<Segment> segments;
  long extent;
  long size() const {
    long n = 0;
    for (const Segment& s : segments) n += s.length;
    return n;
  }
};

Layout Vector() {
  // 3 ints of every 5, 4 blocks.
  Layout l{"vector", MPI_DATATYPE_NULL, {}, 0};
  MPI_Type_vector(4, 3, 5, MPI_INT, &l.type);
  for (int b = 0; b < 4; b++) l.segments.push_back({b * 5 * 4L, 3 * 4L});
  l.extent = (3 * 5 + 3) * 4L;
  return l;
}

Layout Indexed() {
  int lens[] = {2, 1, 4};
  int displs[] = {0, 3, 7};
  Layout l{"indexed", MPI_DATATYPE_NULL, {}, 0};
  MPI_Type_indexed(3, lens, displs, MPI_DOUBLE, &l.type);
  for (int i = 0; i < 3; i++)
    l.segments.push_back({displs[i] * 8L, lens[i] * 8L});
  l.extent = 11 * 8L;
  return l;
}

Layout Struct() {
  // An int at 0, two doubles at 8, five chars at 24; resized to 40 so that
  // consecutive elements leave a gap.
  int lens[] = {1, 2, 5};
  MPI_Aint displs[] = {0, 8, 24};
  MPI_Datatype types[] = {MPI_INT, MPI_DOUBLE, MPI_CHAR};
  MPI_Datatype raw;
  MPI_Type_create_struct(3, lens, displs, types, &raw);
  Layout l{"struct", MPI_DATATYPE_NULL, {{0, 4}, {8, 16}, {24, 5}}, 40};
  MPI_Type_create_resized(raw, 0, 40, &l.type);
  MPI_Type_free(&raw);
  return l;
}

uint8_t Pattern(long i, int seed) {
  return static_cast<uint8_t>((i * 131 + seed * 7 + (i >> 8)) % 251);
}

// The typed buffer of `count` elements whose packed bytes are the pattern,
// gaps set to kGap.
std::vector<uint8_t> Typed(const Layout& l, int count, int seed) {
  std::vector<uint8_t> buf(l.extent * count, kGap);
  long k = 0;
  for (int e = 0; e < count; e++) {
    for (const Segment& s : l.segments) {
      for (long j = 0; j < s.length; j++) {
        buf[e * l.extent + s.offset + j] = Pattern(k++, seed);
      }
    }
  }
  return buf;
}

std::vector<uint8_t> Packed(long bytes, int seed) {
  std::vector<uint8_t> buf(bytes);
  for (long i = 0; i < bytes; i++) buf[i] = Pattern(i, seed);
  return buf;
}

// The first differing byte, or -1.
long FirstDifference(const std::vector<uint8_t>& got,
                     const std::vector<uint8_t>& want) {
  for (size_t i = 0; i < want.size(); i++) {
    if (got[i] != want[i]) return static_cast<long>(i);
  }
  return -1;
}

int failures = 0;

void Report(int rank, const std::string& what, long diff) {
  if (diff < 0) {
    if (rank == 1) printf("PASS %s\n", what.c_str());
    return;
  }
  failures++;
  printf("FAIL %s (rank %d: byte %ld differs)\n", what.c_str(), rank, diff);
}

// One case: rank 0 sends `count` elements of `l` (typed, then as bytes),
// rank 1 receives them typed, as bytes, and typed again.
void RunCase(int rank, const Layout& l, int count, bool nonblocking) {
  long packed = l.size() * count;
  std::string what = l.name + " x" + std::to_string(count) + " (" +
                     std::to_string(packed) + " bytes packed" +
                     (nonblocking ? ", isend/irecv)" : ", send/recv)");
  int seed = count % 97;
  std::vector<uint8_t> typed = Typed(l, count, seed);
  std::vector<uint8_t> bytes = Packed(packed, seed);
  if (rank == 0) {
    MPI_Request reqs[3];
    if (nonblocking) {
      MPI_Isend(typed.data(), count, l.type, 1, 1, MPI_COMM_WORLD, &reqs[0]);
      MPI_Isend(typed.data(), count, l.type, 1, 2, MPI_COMM_WORLD, &reqs[1]);
      MPI_Isend(bytes.data(), packed, MPI_BYTE, 1, 3, MPI_COMM_WORLD, &reqs[2]);
      MPI_Waitall(3, reqs, MPI_STATUSES_IGNORE);
    } else {
      MPI_Send(typed.data(), count, l.type, 1, 1, MPI_COMM_WORLD);
      MPI_Ssend(typed.data(), count, l.type, 1, 2, MPI_COMM_WORLD);
      MPI_Send(bytes.data(), packed, MPI_BYTE, 1, 3, MPI_COMM_WORLD);
    }
    return;
  }
  std::vector<uint8_t> got_typed(typed.size(), kGap);
  std::vector<uint8_t> got_bytes(bytes.size(), 0);
  std::vector<uint8_t> got_unpacked(typed.size(), kGap);
  MPI_Status st[3];
  if (nonblocking) {
    MPI_Request reqs[3];
    // Posted in reverse: the first two arrive unexpected.
    MPI_Irecv(got_unpacked.data(), count, l.type, 0, 3, MPI_COMM_WORLD,
              &reqs[2]);
    MPI_Irecv(got_bytes.data(), packed, MPI_BYTE, 0, 2, MPI_COMM_WORLD,
              &reqs[1]);
    MPI_Irecv(got_typed.data(), count, l.type, 0, 1, MPI_COMM_WORLD, &reqs[0]);
    MPI_Waitall(3, reqs, st);
  } else {
    MPI_Recv(got_typed.data(), count, l.type, 0, 1, MPI_COMM_WORLD, &st[0]);
    MPI_Recv(got_bytes.data(), packed, MPI_BYTE, 0, 2, MPI_COMM_WORLD, &st[1]);
    MPI_Recv(got_unpacked.data(), count, l.type, 0, 3, MPI_COMM_WORLD, &st[2]);
  }
  Report(rank, what + " typed->typed", FirstDifference(got_typed, typed));
  Report(rank, what + " typed->bytes", FirstDifference(got_bytes, bytes));
  Report(rank, what + " bytes->typed", FirstDifference(got_unpacked, typed));
  int n = -1;
  MPI_Get_count(&st[1], MPI_BYTE, &n);
  if (n != packed) {
    failures++;
    printf("FAIL %s: MPI_Get_count says %d bytes\n", what.c_str(), n);
  }
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 2) {
    if (rank == 0) fprintf(stderr, "mpi_datatypes: run with 2 ranks\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  std::vector<Layout> layouts = {Vector(), Indexed(), Struct()};
  for (Layout& l : layouts) {
    MPI_Type_commit(&l.type);
    long unit = l.size();
    // Packed sizes: small, just under, at and just over the threshold, and
    // well into rendezvous.
    long below = kRendezvousBytes / unit;
    for (long count : {1L, below - 1, below, below + 1, (1L << 20) / unit}) {
      for (bool nonblocking : {false, true}) {
        RunCase(rank, l, static_cast<int>(count), nonblocking);
      }
    }
    MPI_Type_free(&l.type);
  }
  int total = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) printf("mpi_datatypes: %d failures\n", total);
  MPI_Finalize();
  return total == 0 ? 0 : 1;
}
