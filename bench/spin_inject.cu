// A CUDA C++ client with a known footprint, traced through CUDA_INJECTION64_PATH (no Python in it):
//   nvcc -O2 -arch=sm_90 -o spin_inject bench/spin_inject.cu
//   ./spin_inject SMS KERNEL_MS ON_MS OFF_MS SECONDS PROGRESS_FILE
// Kernels of exactly SMS blocks, each holding most of an SM's shared memory (no two blocks share an SM),
// spin KERNEL_MS on %globaltimer, back to back for ON_MS, then the host sleeps OFF_MS. After every
// synchronize it appends "wall-time kernels-finished" to PROGRESS_FILE (bench/ctxsw_jobs.py's format).
#include <cstdio>
#include <cstdlib>
#include <sys/time.h>
#include <unistd.h>

__global__ void spin(unsigned long long ns) {
  extern __shared__ char hold_the_sm[];
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); } while (now - start < ns);
  if (threadIdx.x == 0) hold_the_sm[0] = 1;
}

static double wall() { timeval tv; gettimeofday(&tv, nullptr); return tv.tv_sec + tv.tv_usec / 1e6; }

int main(int argc, char **argv) {
  if (argc < 7) { fprintf(stderr, "usage: spin_inject SMS KERNEL_MS ON_MS OFF_MS SECONDS PROGRESS\n"); return 2; }
  int sms = atoi(argv[1]);
  double kernel_ms = atof(argv[2]), on_ms = atof(argv[3]), off_ms = atof(argv[4]), seconds = atof(argv[5]);
  FILE *progress = fopen(argv[6], "a");
  int shared = 150 * 1024;  // more than half of the 228 KiB an SM has: one block per SM
  cudaFuncSetAttribute(spin, cudaFuncAttributeMaxDynamicSharedMemorySize, shared);
  spin<<<sms, 32, shared>>>(1000000ULL);
  cudaDeviceSynchronize();
  long done = 0;
  double end = wall() + seconds;
  fprintf(progress, "%.6f %ld\n", wall(), done);
  while (wall() < end) {
    double burst_end = wall() + on_ms / 1e3;
    while (wall() < burst_end) {
      for (int i = 0; i < 4; i++) spin<<<sms, 32, shared>>>((unsigned long long)(kernel_ms * 1e6));
      cudaDeviceSynchronize();
      done += 4;
      fprintf(progress, "%.6f %ld\n", wall(), done);
    }
    fflush(progress);
    if (off_ms > 0) usleep((useconds_t)(off_ms * 1e3));
  }
  fclose(progress);
  printf("{\"kernels\": %ld}\n", done);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
