/* The native record path of gpu_trace: CUPTI's activity buffers read and summarised in C.
 *
 * One window: enable kernel, memcpy and memset records (queued timestamps where asked: gt_prepare), wait,
 * disable, let kernels running across the end finish, flush, detach CUPTI (cuptiFinalize: its launch hooks
 * cost even with every activity disabled), then sweep each GPU's intervals once. CUPTI's buffer thread only
 * copies five numbers per record into an array: no Python object, no GIL, no allocation per record.
 *
 * Two entries, one library:
 *  - Python processes load it with ctypes (gpu_trace/native/__init__.py) and call gt_trace() from the
 *    tracer's own thread (ctypes releases the GIL for the whole window);
 *  - any other CUDA program (C++, Fortran, Triton, TensorRT) gets it through CUDA_INJECTION64_PATH: the
 *    driver calls InitializeInjection() at cuInit, which starts a thread that speaks gpu_trace/protocol.py
 *    on the exporter's socket.
 *
 * Nothing CUDA is needed to build it: the few CUPTI, driver and NVML declarations it uses are written out
 * below (the layouts of CUPTI's documented records, cupti_activity.h), and the libraries are opened at run
 * time. bench/native_layout.sh checks the offsets against the toolkit's own headers on the device.
 *
 * What a window counts (per GPU, all clipped to [lo, hi] on CUPTI's clock):
 *  - kernel_busy: the union of its kernels' intervals;
 *  - backlog: work queued before the window that runs inside it. CUPTI records only what is launched while
 *    it is enabled, but a stream runs in order: when the first kernel launched on a stream inside the
 *    window waited (start - queued > QUEUE_WAIT_NS), everything before it on that stream had been queued
 *    before the window and was still pending, so that stream was busy from lo until that kernel started (or
 *    the whole window, when it had not started by the flush). Its SMs are taken as that kernel's;
 *  - sm_copy_busy: device-to-device copies and memsets: they run on the SMs (a copy kernel of the driver's),
 *    counted as holding every SM the process may use;
 *  - queue gaps: between two kernels (or copies) of one stream, when the second was queued before the first
 *    ended (without queued timestamps: when it started at most TURN_NS after), the GPU was turning from one
 *    to the next of this process's work (a few us each; a burst of small kernels has thousands): busy in
 *    time, as NVML and CUDA events count it, with no SMs held;
 *  - busy: the union of all of the above; sm_seconds: the integral of the SMs they hold (min 1 of the GPU);
 *  - copy_busy: host-device and peer copies, on the copy engines: no SMs.
 * A kernel's SMs come from its grid and resources (occupancy, as gpu_trace/occupancy.py), spread over the
 * SMs THIS process may use (under MPS an active-thread limit shrinks what the device reports), as a share
 * of the GPU's SMs (NVML's core count over the cores per SM of its architecture), never more.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define GT_EXPORT __attribute__((visibility("default")))

/* ---- CUPTI's record layouts (the fields read; cupti_activity.h) ------------------------------------- */
enum { KIND_MEMCPY = 1, KIND_MEMSET = 2, KIND_CONCURRENT_KERNEL = 10 };
enum { COPY_DTOD = 8 };
/* CUpti_ActivityKernel4 and later: the same leading fields (newer versions append). */
enum {
  K_REGISTERS = 6, K_START = 16, K_END = 24, K_DEVICE = 40, K_STREAM = 48, K_GRID = 52, K_BLOCK = 64,
  K_STATIC_SHARED = 76, K_DYNAMIC_SHARED = 80, K_QUEUED = 120, K_SUBMITTED = 128, K_MIN_SIZE = 136
};
/* CUpti_ActivityMemcpy5/6 and CUpti_ActivityMemset3/4: the same leading fields. */
enum { C_COPY_KIND = 4, C_START = 16, C_END = 24, C_DEVICE = 32, C_STREAM = 40, C_MIN_SIZE = 48 };

typedef int (*cupti_register_fn)(void (*)(uint8_t **, size_t *, size_t *),
                                 void (*)(void *, uint32_t, uint8_t *, size_t, size_t));
typedef int (*cupti_kind_fn)(int);
typedef int (*cupti_flush_fn)(uint32_t);
typedef int (*cupti_next_fn)(uint8_t *, size_t, void **);
typedef int (*cupti_timestamp_fn)(uint64_t *);
typedef int (*cupti_void_fn)(void);
typedef int (*cupti_u8_fn)(uint8_t);
typedef int (*cupti_result_string_fn)(int, const char **);

static struct {
  void *lib;
  cupti_register_fn register_callbacks;
  cupti_kind_fn enable, disable;
  cupti_flush_fn flush_all;
  cupti_next_fn next_record;
  cupti_timestamp_fn timestamp;
  cupti_void_fn finalize;
  cupti_u8_fn latency_timestamps;
  cupti_u8_fn hw_trace;   /* Blackwell on: kernel timestamps from the GPU's hardware events, no instrumentation */
  cupti_result_string_fn result_string;
} cupti;

/* ---- limits ---------------------------------------------------------------------------------------- */
#define MAX_DEVICES 16
#define MAX_STREAMS 4096          /* per window: the first kernel of each (backlog rule); more are not followed */
#define SHAPE_SLOTS 4096          /* launch shape -> SM share cache (kernels repeat their shapes) */
#define BUFFER_BYTES (1u << 20)   /* one CUPTI activity buffer (~7,000 kernel records) */
#define DEFAULT_MAX_RECORDS (1u << 20) /* per window: 24 MiB at most, freed when the window ends */
#define QUEUE_WAIT_NS 20000       /* a launch waits a few us on an idle stream; longer is work ahead of it */
#define QUEUE_GAP_MAX_NS 100000   /* a longer gap between queued work is a wait on something else (an event) */
#define TURN_NS 3000              /* without queued timestamps: see add_queue_gaps */
#define SETTLE_NS 100000000LL     /* after the disable: kernels running across the end complete */
#define MAX_WINDOW_S 120.0
#define MAX_WARM_S 1.5            /* GPU_SPATIAL_TRACE_WARM_S: CUPTI enabled this long before the window opens */

typedef struct {
  int sm_count;           /* what this process's device reports: under MPS, the SMs it may use */
  int gpu_sm_count;       /* the whole GPU's (NVML); never below sm_count (where NVML cannot tell: sm_count), so
                           * no share of it is above 1 */
  int max_warps, max_blocks, registers, shared;
  char uuid[48];
} device_t;

typedef struct {          /* one interval kept for the sweep: 40 bytes */
  int64_t start, end, queued;  /* queued: 0 where CUPTI did not collect it */
  float sm;               /* share of the GPU's SMs it holds while it runs (0 for copy-engine copies) */
  uint32_t stream;
  int16_t device;
  uint8_t kind;           /* REC_* */
} record_t;
enum { REC_KERNEL, REC_SM_COPY, REC_COPY, REC_BACKLOG, REC_QUEUE_GAP };

typedef struct {          /* per stream: its first kernel launched inside the window */
  uint32_t stream;
  int16_t device;
  int64_t queued, start;
  float sm;
  int used;
} stream_first_t;

static struct {
  pthread_mutex_t lock;
  int taking;             /* records are kept only while a window takes them */
  record_t *records;
  size_t count, capacity, max_records, refused;
  stream_first_t streams[MAX_STREAMS];
  size_t streams_untracked;
  int64_t lo;             /* the window's start on CUPTI's clock (queued before it: not ours to see) */
  uint64_t incomplete, late;
  int full;
  device_t devices[MAX_DEVICES];
  int device_count;
  struct { uint64_t key; float sm; int used; } shapes[SHAPE_SLOTS];
} W = {.lock = PTHREAD_MUTEX_INITIALIZER, .max_records = DEFAULT_MAX_RECORDS};

static char last_error[512];

/* GPU_SPATIAL_TRACE_DEBUG=1: each CUPTI step of a window on stderr, with the time it took. */
static int debug_on(void) {
  const char *v = getenv("GPU_SPATIAL_TRACE_DEBUG");
  return v && *v == '1';
}

static int switched_off(const char *name) {  /* GPU_SPATIAL_TRACE_DETACH=0 */
  const char *v = getenv(name);
  return v && *v == '0';
}

static double warm_seconds(void) {  /* GPU_SPATIAL_TRACE_WARM_S, 0 to MAX_WARM_S */
  const char *v = getenv("GPU_SPATIAL_TRACE_WARM_S");
  double s = v ? strtod(v, NULL) : 0.0;
  return s > 0.0 ? (s < MAX_WARM_S ? s : MAX_WARM_S) : 0.0;  /* NaN and junk: 0 */
}

static int switched_on(const char *name) {  /* GPU_SPATIAL_TRACE_QUEUED=1 */
  const char *v = getenv(name);
  return v && *v == '1';
}

static void set_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
}

GT_EXPORT const char *gt_last_error(void) { return last_error; }

/* ---- occupancy (gpu_trace/occupancy.py, the same rules) --------------------------------------------- */
#define REGISTER_UNIT 256
#define RESERVED_SHARED_PER_BLOCK 1024
#define SHARED_UNIT 128

GT_EXPORT int gt_blocks_per_sm(int max_warps, int max_blocks, int registers_per_sm, int shared_per_sm,
                               int threads, int registers_per_thread, int shared_per_block) {
  int warps = (threads + 31) / 32;  /* a partial warp takes a whole warp's slot */
  if (warps < 1) warps = 1;
  int fit = max_warps / warps;
  if (fit > max_blocks) fit = max_blocks;
  if (registers_per_thread > 0) {
    long per_warp = ((long)registers_per_thread * 32 + REGISTER_UNIT - 1) / REGISTER_UNIT * REGISTER_UNIT;
    long by_registers = registers_per_sm / (per_warp * warps);
    if (by_registers < fit) fit = (int)by_registers;
  }
  if (shared_per_block > 0) {
    long per_block = ((long)shared_per_block + SHARED_UNIT - 1) / SHARED_UNIT * SHARED_UNIT + RESERVED_SHARED_PER_BLOCK;
    long by_shared = shared_per_sm / per_block;
    if (by_shared < fit) fit = (int)by_shared;
  }
  return fit < 1 ? 1 : fit;  /* a kernel that launched fits at least one block */
}

/* SMs the grid holds on average over its waves, spread over `sms` SMs. */
GT_EXPORT double gt_sms_occupied(int sms, long blocks, int fit) {
  if (blocks <= 0 || sms <= 0) return 0.0;
  long wave = (long)sms * (fit < 1 ? 1 : fit);
  long waves = (blocks + wave - 1) / wave;
  long last = blocks - (waves - 1) * wave;
  return ((double)(waves - 1) * sms + (double)(last < sms ? last : sms)) / (double)waves;
}

static float kernel_share(const device_t *d, long blocks, int threads, int registers, int shared) {
  uint64_t key = ((uint64_t)blocks * 1000003u) ^ ((uint64_t)threads << 40) ^ ((uint64_t)registers << 28) ^
                 ((uint64_t)shared << 8) ^ (uint64_t)(d - W.devices);
  size_t slot = (size_t)(key % SHAPE_SLOTS);
  if (W.shapes[slot].used && W.shapes[slot].key == key) return W.shapes[slot].sm;
  int fit = gt_blocks_per_sm(d->max_warps, d->max_blocks, d->registers, d->shared, threads, registers, shared);
  float sm = (float)(gt_sms_occupied(d->sm_count, blocks, fit) / (double)d->gpu_sm_count);  /* <= 1: see device_t */
  W.shapes[slot].key = key;
  W.shapes[slot].sm = sm;
  W.shapes[slot].used = 1;
  return sm;
}

static float whole_share(const device_t *d) {  /* every SM this process may use */
  return (float)((double)d->sm_count / (double)d->gpu_sm_count);
}

/* ---- one record, decoded at CUPTI's offsets --------------------------------------------------------- */
#define FIELD(type, base, offset) (*(const type *)((const uint8_t *)(base) + (offset)))

static const device_t *device_of(uint32_t id) {
  return id < (uint32_t)W.device_count ? &W.devices[id] : NULL;
}

static int keep(int64_t start, int64_t end, float sm, uint32_t device, uint8_t kind, uint32_t stream,
                int64_t queued) {
  if (W.count >= W.max_records) {
    W.refused++;
    W.full = 1;
    return 0;
  }
  if (W.count == W.capacity) {
    size_t grown = W.capacity ? W.capacity * 2 : 65536;
    if (grown > W.max_records) grown = W.max_records;
    record_t *r = realloc(W.records, grown * sizeof *r);
    if (!r) {
      W.refused++;
      W.full = 1;
      return 0;
    }
    W.records = r;
    W.capacity = grown;
  }
  W.records[W.count++] = (record_t){start, end, queued, sm, stream, (int16_t)device, kind};
  return 1;
}

static void note_stream(uint32_t stream, uint32_t device, int64_t queued, int64_t start, float sm) {
  if (queued < W.lo) return;  /* launched before the window: no record of it should exist */
  size_t free_slot = MAX_STREAMS;
  for (size_t i = (stream * 2654435761u + device) % MAX_STREAMS, n = 0; n < MAX_STREAMS;
       i = (i + 1) % MAX_STREAMS, n++) {
    stream_first_t *s = &W.streams[i];
    if (!s->used) { free_slot = i; break; }
    if (s->stream == stream && s->device == (int16_t)device) {
      if (queued < s->queued) { s->queued = queued; s->start = start; s->sm = sm; }
      return;
    }
  }
  if (free_slot == MAX_STREAMS) { W.streams_untracked++; return; }
  W.streams[free_slot] = (stream_first_t){stream, (int16_t)device, queued, start, sm, 1};
}

/* One activity record; `size` is what the buffer holds from it on. The caller holds W.lock. */
static void take(const uint8_t *r, size_t size) {
  uint32_t kind = FIELD(uint32_t, r, 0);
  if (kind == KIND_CONCURRENT_KERNEL && size >= K_MIN_SIZE) {
    const device_t *d = device_of(FIELD(uint32_t, r, K_DEVICE));
    if (!d) return;
    int64_t start = (int64_t)FIELD(uint64_t, r, K_START), end = (int64_t)FIELD(uint64_t, r, K_END);
    long blocks = (long)FIELD(int32_t, r, K_GRID) * FIELD(int32_t, r, K_GRID + 4) * FIELD(int32_t, r, K_GRID + 8);
    int threads = FIELD(int32_t, r, K_BLOCK) * FIELD(int32_t, r, K_BLOCK + 4) * FIELD(int32_t, r, K_BLOCK + 8);
    int shared = FIELD(int32_t, r, K_STATIC_SHARED) + FIELD(int32_t, r, K_DYNAMIC_SHARED);
    float sm = kernel_share(d, blocks, threads, FIELD(uint16_t, r, K_REGISTERS), shared);
    int64_t queued = (int64_t)FIELD(uint64_t, r, K_QUEUED);
    if (start > 0 && end > 0 && end < start) { W.incomplete++; return; }  /* inconsistent: not evidence */
    /* start 0: still queued at the flush; end 0: still running (a forced flush): what it says of its stream's
     * backlog holds, its own interval is not known */
    if (queued > 0) note_stream(FIELD(uint32_t, r, K_STREAM), FIELD(uint32_t, r, K_DEVICE), queued, start, sm);
    if (start <= 0 || end <= 0) { W.incomplete++; return; }
    keep(start, end, sm, FIELD(uint32_t, r, K_DEVICE), REC_KERNEL, FIELD(uint32_t, r, K_STREAM), queued);
  } else if ((kind == KIND_MEMCPY || kind == KIND_MEMSET) && size >= C_MIN_SIZE) {
    const device_t *d = device_of(FIELD(uint32_t, r, C_DEVICE));
    if (!d) return;
    int64_t start = (int64_t)FIELD(uint64_t, r, C_START), end = (int64_t)FIELD(uint64_t, r, C_END);
    if (start <= 0 || end < start) { W.incomplete++; return; }
    int on_sms = kind == KIND_MEMSET || FIELD(uint8_t, r, C_COPY_KIND) == COPY_DTOD;
    keep(start, end, on_sms ? whole_share(d) : 0.0f, FIELD(uint32_t, r, C_DEVICE), on_sms ? REC_SM_COPY : REC_COPY,
         FIELD(uint32_t, r, C_STREAM), 0);
  }
}

/* CUPTI's buffer callbacks (its own thread, or the flushing one). */
static void buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
  *buffer = aligned_alloc(8, BUFFER_BYTES);
  *size = *buffer ? BUFFER_BYTES : 0;
  *max_records = 0;
}

/* W.lock is never held across a CUPTI call: CUPTI may call this on one thread while another, inside a CUPTI
 * call (a forced flush), waits for CUPTI's own lock; holding ours across next_record stalled a trainer's
 * second window on the device (bench/RESULTS.md). */
static void buffer_completed(void *ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid) {
  (void)ctx; (void)stream; (void)size;
  void *record = NULL;
  while (cupti.next_record(buffer, valid, &record) == 0) {
    pthread_mutex_lock(&W.lock);
    if (W.taking) take(record, (size_t)(buffer + valid - (uint8_t *)record));
    else W.late++;
    pthread_mutex_unlock(&W.lock);
  }
  free(buffer);
}

/* ---- the window's bookkeeping (shared by gt_trace and the tests' synthetic buffers) ----------------- */
static void window_open(int64_t lo) {
  pthread_mutex_lock(&W.lock);
  W.count = W.refused = W.streams_untracked = 0;
  W.incomplete = W.late = 0;
  W.full = 0;
  W.lo = lo;
  memset(W.streams, 0, sizeof W.streams);
  memset(W.shapes, 0, sizeof W.shapes);
  W.taking = 1;
  pthread_mutex_unlock(&W.lock);
}

static void window_close(void) {
  pthread_mutex_lock(&W.lock);
  W.taking = 0;
  pthread_mutex_unlock(&W.lock);
}

static void window_free(void) {
  pthread_mutex_lock(&W.lock);
  free(W.records);
  W.records = NULL;
  W.count = W.capacity = 0;
  pthread_mutex_unlock(&W.lock);
}

/* Backlog: a stream whose first launch in the window waited had work queued before the window. */
static void add_backlog(int64_t lo, int64_t hi) {
  for (size_t i = 0; i < MAX_STREAMS; i++) {
    stream_first_t *s = &W.streams[i];
    if (!s->used) continue;
    int64_t until = s->start > 0 ? s->start : hi;  /* not started by the flush: waited all window */
    if (until - s->queued > QUEUE_WAIT_NS && until > lo)
      keep(lo, until < hi ? until : hi, s->sm, s->device, REC_BACKLOG, s->stream, 0);
  }
}

static int stream_order(const void *a, const void *b) {
  const record_t *x = *(record_t *const *)a, *y = *(record_t *const *)b;
  if (x->device != y->device) return x->device - y->device;
  if (x->stream != y->stream) return x->stream < y->stream ? -1 : 1;
  return x->start < y->start ? -1 : x->start > y->start;
}

/* Queue gaps: consecutive SM work of one stream, the second queued before the first ended. Where CUPTI did
 * not collect queued timestamps (the default), a gap of at most TURN_NS is taken as such a turn: work queued
 * behind a kernel starts 1-2 us after it ends on Hopper (the deep-queue client's 184,000 kernels a window:
 * 2.3 us apart on average, bench/RESULTS.md), while work launched into an idle stream waits out the launch
 * path (its submission alone takes longer); a gap that is not a turn but this short is at most TURN_NS of
 * busy time per kernel. */
static int add_queue_gaps(void) {
  size_t n = 0, total = W.count;
  record_t **order = malloc((total ? total : 1) * sizeof *order);
  if (!order) { set_error("no memory for the queue gaps of %zu records", total); return -1; }
  for (size_t i = 0; i < total; i++)
    if (W.records[i].kind == REC_KERNEL || W.records[i].kind == REC_SM_COPY) order[n++] = &W.records[i];
  qsort(order, n, sizeof *order, stream_order);
  record_t *gaps = malloc((n ? n : 1) * sizeof *gaps);  /* kept apart first: keep() may move the records */
  if (!gaps) { free(order); set_error("no memory for the queue gaps of %zu records", total); return -1; }
  size_t g = 0;
  for (size_t i = 1; i < n; i++) {
    const record_t *a = order[i - 1], *b = order[i];
    if (a->device != b->device || a->stream != b->stream || b->start <= a->end) continue;
    int64_t gap = b->start - a->end;
    if (b->queued > 0 ? b->queued <= a->end && gap <= QUEUE_GAP_MAX_NS : gap <= TURN_NS)
      gaps[g++] = (record_t){a->end, b->start, 0, 0.0f, a->stream, a->device, REC_QUEUE_GAP};
  }
  free(order);
  for (size_t i = 0; i < g; i++)
    keep(gaps[i].start, gaps[i].end, gaps[i].sm, (uint32_t)gaps[i].device, gaps[i].kind, gaps[i].stream, 0);
  free(gaps);
  return 0;
}

/* ---- the sweep -------------------------------------------------------------------------------------- */
typedef struct { int64_t t; float w; int8_t d; } edge_t;

static int edge_order(const void *a, const void *b) {  /* edges at one instant in any order: no gap between */
  const edge_t *x = a, *y = b;
  return x->t < y->t ? -1 : x->t > y->t;
}

/* Union of the selected intervals and the integral of min(1, sum of their SM shares), in ns, over [lo, hi]. */
static void sweep(edge_t *edges, int device, unsigned kinds, int64_t lo, int64_t hi, double *busy, double *sm) {
  size_t n = 0;
  for (size_t i = 0; i < W.count; i++) {
    const record_t *r = &W.records[i];
    if (r->device != device || !(kinds & (1u << r->kind))) continue;
    int64_t s = r->start < lo ? lo : r->start, e = r->end > hi ? hi : r->end;
    if (e <= s) continue;
    edges[n++] = (edge_t){s, r->sm, 1};
    edges[n++] = (edge_t){e, -r->sm, -1};
  }
  *busy = *sm = 0.0;
  if (!n) return;
  qsort(edges, n, sizeof *edges, edge_order);
  long running = 0;
  double load = 0.0;
  for (size_t i = 0; i + 1 < n; i++) {
    running += edges[i].d;
    load += edges[i].w;
    double gap = (double)(edges[i + 1].t - edges[i].t);
    if (running > 0 && gap > 0) {
      *busy += gap;
      *sm += gap * (load < 0.0 ? 0.0 : load > 1.0 ? 1.0 : load);  /* float drift cannot go below 0 or past 1 */
    }
  }
}

#define BIT(k) (1u << (k))

static int summarise(int64_t lo, int64_t hi, char *out, size_t cap, size_t *used) {
  edge_t *edges = malloc((W.count ? W.count : 1) * 2 * sizeof *edges);
  if (!edges) { set_error("no memory for the summary of %zu records", W.count); return -1; }
  size_t at = 0;
  int written = snprintf(out, cap, "[");
  at += written > 0 ? (size_t)written : 0;
  for (int d = 0; d < W.device_count && at < cap; d++) {
    double kernel_busy, kernel_sm, copy_sm_busy, unused, backlog_busy, busy, sm, copy_busy;
    sweep(edges, d, BIT(REC_KERNEL), lo, hi, &kernel_busy, &kernel_sm);
    sweep(edges, d, BIT(REC_SM_COPY), lo, hi, &copy_sm_busy, &unused);
    sweep(edges, d, BIT(REC_BACKLOG), lo, hi, &backlog_busy, &unused);
    double gap_busy;
    sweep(edges, d, BIT(REC_QUEUE_GAP), lo, hi, &gap_busy, &unused);
    sweep(edges, d, BIT(REC_KERNEL) | BIT(REC_SM_COPY) | BIT(REC_BACKLOG) | BIT(REC_QUEUE_GAP), lo, hi, &busy, &sm);
    sweep(edges, d, BIT(REC_COPY), lo, hi, &copy_busy, &unused);
    size_t kernels = 0;
    for (size_t i = 0; i < W.count; i++) {
      const record_t *r = &W.records[i];
      kernels += r->device == d && r->kind == REC_KERNEL && r->end > lo && r->start < hi;
    }
    const device_t *dv = &W.devices[d];
    written = snprintf(out + at, cap - at,
        "%s{\"uuid\":\"%s\",\"kernels\":%zu,\"kernel_busy_s\":%.9f,\"backlog_busy_s\":%.9f,"
        "\"sm_copy_busy_s\":%.9f,\"queue_gap_s\":%.9f,\"busy_s\":%.9f,\"sm_seconds\":%.9f,\"copy_busy_s\":%.9f,"
        "\"sms\":%d,\"gpu_sms\":%d}",
        d ? "," : "", dv->uuid, kernels, kernel_busy / 1e9, backlog_busy / 1e9, copy_sm_busy / 1e9, gap_busy / 1e9,
        busy / 1e9,
        sm / 1e9, copy_busy / 1e9, dv->sm_count, dv->gpu_sm_count);
    at += written > 0 ? (size_t)written : 0;
  }
  free(edges);
  if (at + 2 >= cap) { set_error("summary larger than %zu bytes", cap); return -1; }
  out[at++] = ']';
  out[at] = 0;
  *used = at;
  return 0;
}

/* ---- the tests' entry: synthetic buffers laid out as CUPTI lays them out ---------------------------- */
/* Records follow each other at their `size` (the first 4 bytes of each after the kind are not a size in
 * CUPTI's format: the test passes the record sizes it laid out, as cuptiActivityGetNextRecord knows them). */
GT_EXPORT int gt_test_devices(int count, const int *sm_count, const int *gpu_sm_count) {
  if (count < 0 || count > MAX_DEVICES) return -1;
  W.device_count = count;
  for (int i = 0; i < count; i++) {
    W.devices[i] = (device_t){sm_count[i], gpu_sm_count[i] > sm_count[i] ? gpu_sm_count[i] : sm_count[i],
                              64, 32, 65536, 233472, ""};
    snprintf(W.devices[i].uuid, sizeof W.devices[i].uuid, "GPU-%08d-0000-0000-0000-000000000000", i);
  }
  return 0;
}

GT_EXPORT void gt_test_open(int64_t lo, size_t max_records) {
  W.max_records = max_records ? max_records : DEFAULT_MAX_RECORDS;
  window_open(lo);
}

GT_EXPORT size_t gt_test_feed(const uint8_t *buffer, size_t valid, size_t record_size) {
  size_t taken = 0;
  pthread_mutex_lock(&W.lock);
  for (size_t at = 0; record_size && at + record_size <= valid; at += record_size, taken++)
    take(buffer + at, record_size);  /* a record cut by the buffer's end is not read */
  pthread_mutex_unlock(&W.lock);
  return taken;
}

GT_EXPORT int gt_test_summary(int64_t lo, int64_t hi, char *out, size_t cap) {
  window_close();
  add_backlog(lo, hi);
  if (add_queue_gaps() != 0) return -1;
  size_t used;
  return summarise(lo, hi, out, cap, &used);
}

GT_EXPORT size_t gt_test_counts(size_t *refused, uint64_t *incomplete) {
  *refused = W.refused;
  *incomplete = W.incomplete;
  return W.count;
}

GT_EXPORT void gt_test_close(void) { window_free(); }

/* ---- CUDA driver and NVML: the devices this process sees -------------------------------------------- */
typedef int (*cu_init_fn)(unsigned);
typedef int (*cu_count_fn)(int *);
typedef int (*cu_get_fn)(int *, int);
typedef int (*cu_attr_fn)(int *, int, int);
typedef int (*cu_uuid_fn)(unsigned char *, int);
enum {
  CU_ATTR_SM_COUNT = 16, CU_ATTR_MAX_THREADS_PER_SM = 39, CU_ATTR_SHARED_PER_SM = 81,
  CU_ATTR_REGISTERS_PER_SM = 82, CU_ATTR_MAX_BLOCKS_PER_SM = 106, CU_ATTR_CC_MAJOR = 75, CU_ATTR_CC_MINOR = 76
};
typedef int (*nvml_init_fn)(void);
typedef int (*nvml_by_uuid_fn)(const char *, void **);
typedef int (*nvml_cores_fn)(void *, unsigned *);

/* Cores per SM by compute capability (CUDA C Programming Guide, "Arithmetic Instructions"). */
static int cores_per_sm(int major, int minor) {
  if (major == 7 || (major == 8 && minor == 0)) return 64;
  if (major >= 8) return 128;
  return 0;
}

static int gpu_sms_from_nvml(const char *uuid, int major, int minor) {
  static void *nvml;
  static nvml_by_uuid_fn by_uuid;
  static nvml_cores_fn cores;
  static int tried;
  if (!tried) {
    tried = 1;
    nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    nvml_init_fn init = nvml ? (nvml_init_fn)dlsym(nvml, "nvmlInit_v2") : NULL;
    by_uuid = nvml ? (nvml_by_uuid_fn)dlsym(nvml, "nvmlDeviceGetHandleByUUID") : NULL;
    cores = nvml ? (nvml_cores_fn)dlsym(nvml, "nvmlDeviceGetNumGpuCores") : NULL;
    if (!init || init() != 0) by_uuid = NULL;
  }
  void *handle;
  unsigned n;
  int per_sm = cores_per_sm(major, minor);
  if (!by_uuid || !cores || !per_sm || by_uuid(uuid, &handle) != 0 || cores(handle, &n) != 0) return 0;
  return (int)(n / (unsigned)per_sm);
}

static int query_devices(void) {
  void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!cuda) { set_error("libcuda.so.1 cannot be opened: %s", dlerror()); return -1; }
  cu_init_fn init = (cu_init_fn)dlsym(cuda, "cuInit");
  cu_count_fn count = (cu_count_fn)dlsym(cuda, "cuDeviceGetCount");
  cu_get_fn get = (cu_get_fn)dlsym(cuda, "cuDeviceGet");
  cu_attr_fn attr = (cu_attr_fn)dlsym(cuda, "cuDeviceGetAttribute");
  cu_uuid_fn uuid = (cu_uuid_fn)dlsym(cuda, "cuDeviceGetUuid_v2");
  if (!uuid) uuid = (cu_uuid_fn)dlsym(cuda, "cuDeviceGetUuid");
  int n = 0;
  if (!init || !count || !get || !attr || !uuid || init(0) != 0 || count(&n) != 0) {
    set_error("the CUDA driver does not answer");
    return -1;
  }
  if (n > MAX_DEVICES) n = MAX_DEVICES;
  for (int i = 0; i < n; i++) {
    int dev, v[7] = {0};
    unsigned char u[16];
    int attrs[7] = {CU_ATTR_SM_COUNT, CU_ATTR_MAX_THREADS_PER_SM, CU_ATTR_MAX_BLOCKS_PER_SM, CU_ATTR_REGISTERS_PER_SM,
                    CU_ATTR_SHARED_PER_SM, CU_ATTR_CC_MAJOR, CU_ATTR_CC_MINOR};
    if (get(&dev, i) != 0 || uuid(u, dev) != 0) { set_error("CUDA device %d does not answer", i); return -1; }
    for (int a = 0; a < 7; a++)
      if (attr(&v[a], attrs[a], dev) != 0) { set_error("CUDA device %d: attribute %d", i, attrs[a]); return -1; }
    device_t *d = &W.devices[i];
    snprintf(d->uuid, sizeof d->uuid,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2], u[3],
             u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
    d->sm_count = v[0] > 0 ? v[0] : 1;
    d->max_warps = v[1] / 32;
    d->max_blocks = v[2];
    d->registers = v[3];
    d->shared = v[4];
    int whole = gpu_sms_from_nvml(d->uuid, v[5], v[6]);
    d->gpu_sm_count = whole > d->sm_count ? whole : d->sm_count;
  }
  W.device_count = n;
  return 0;
}

/* ---- CUPTI: opened at the first window ------------------------------------------------------------- */
static int load_cupti(const char *path) {
  if (cupti.lib) return 0;
  const char *names[] = {path, getenv("GPU_SPATIAL_CUPTI_LIBRARY"), "libcupti.so", "libcupti.so.13",
                         "libcupti.so.12", "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so", NULL};
  void *lib = NULL;
  for (size_t i = 0; i < sizeof names / sizeof *names && !lib; i++)
    if (names[i] && *names[i]) lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (!lib) { set_error("libcupti cannot be opened (set GPU_SPATIAL_CUPTI_LIBRARY to its path)"); return -1; }
#define SYM(field, name) cupti.field = (__typeof__(cupti.field))dlsym(lib, name)
  SYM(register_callbacks, "cuptiActivityRegisterCallbacks");
  SYM(enable, "cuptiActivityEnable");
  SYM(disable, "cuptiActivityDisable");
  SYM(flush_all, "cuptiActivityFlushAll");
  SYM(next_record, "cuptiActivityGetNextRecord");
  SYM(timestamp, "cuptiGetTimestamp");
  SYM(finalize, "cuptiFinalize");
  SYM(latency_timestamps, "cuptiActivityEnableLatencyTimestamps");
  SYM(hw_trace, "cuptiActivityEnableHWTrace");
  SYM(result_string, "cuptiGetResultString");
#undef SYM
  if (!cupti.register_callbacks || !cupti.enable || !cupti.disable || !cupti.flush_all || !cupti.next_record ||
      !cupti.timestamp) {
    set_error("libcupti lacks the activity API");
    dlclose(lib);
    memset(&cupti, 0, sizeof cupti);
    return -1;
  }
  cupti.lib = lib;
  return 0;
}

static int check(int rc, const char *call) {
  if (rc == 0) return 0;
  const char *why = NULL;
  if (cupti.result_string) cupti.result_string(rc, &why);
  set_error("%s failed: %s (%d)", call, why ? why : "CUPTI error", rc);
  return -1;
}

static double wall_now(void) {
  struct timeval tv;
  gettimeofday(&tv, NULL);
  return (double)tv.tv_sec + tv.tv_usec / 1e6;
}

static void sleep_ns(int64_t ns) {
  struct timespec ts = {ns / 1000000000LL, ns % 1000000000LL};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

/* Sleeps `seconds`, ending early when *stop becomes non-zero (or, with until_full, the store fills): either
 * is seen within 20 ms. */
static void wait_while_wanted(double seconds, volatile int *stop, int until_full) {
  for (int64_t left = (int64_t)(seconds * 1e9); left > 0 && !(stop && *stop) && !(until_full && W.full);) {
    int64_t step = left < 20000000LL ? left : 20000000LL;
    sleep_ns(step);
    left -= step;
  }
}

/* CUPTI collects kernels' queued and submitted timestamps only when asked before CUDA initialises, once
 * (never again in the session): the Python hook calls this at start-up, the injection at cuInit. Opt-in
 * (GPU_SPATIAL_TRACE_QUEUED=1): with them, a trainer launching from two threads stalled in a window's forced
 * flush on the device, asked at every window and asked once alike (bench/RESULTS.md). Without them the
 * backlog rule is idle (work queued before a window is not counted) and a turn between one stream's works
 * is told by its length alone (TURN_NS). */
GT_EXPORT int gt_prepare(void) {
  if (!switched_on("GPU_SPATIAL_TRACE_QUEUED")) return 0;
  if (load_cupti(NULL) != 0) return -1;
  return cupti.latency_timestamps ? check(cupti.latency_timestamps(1), "cuptiActivityEnableLatencyTimestamps") : -1;
}

GT_EXPORT int gt_load(const char *cupti_path) {
  if (load_cupti(cupti_path) != 0) return -1;
  return W.device_count ? 0 : query_devices();
}

static const int KINDS[] = {KIND_CONCURRENT_KERNEL, KIND_MEMCPY, KIND_MEMSET};

/* One window of `seconds` (shorter when *stop becomes non-zero or the store fills): the report's body as
 * one JSON object in `out`. 0, or -1 with gt_last_error(). Only one window at a time runs (the callers'). */
GT_EXPORT int gt_trace(double seconds, volatile int *stop, char *out, size_t cap) {
  static int registered;
  if (gt_load(NULL) != 0) return -1;
  if (!(seconds > 0.0)) seconds = 0.0;
  if (seconds > MAX_WINDOW_S) seconds = MAX_WINDOW_S;
  if (!registered && check(cupti.register_callbacks(buffer_requested, buffer_completed),
                           "cuptiActivityRegisterCallbacks") != 0) return -1;
  registered = 1;
  int debug = debug_on();
  double step_at = wall_now();
#define STEP(name) do { if (debug) { double t_ = wall_now(); fprintf(stderr, "gpu_trace[%d]: %s %.4f s\n", \
    (int)getpid(), name, t_ - step_at); step_at = t_; } } while (0)
  uint64_t lo = 0, hi = 0;
  W.max_records = DEFAULT_MAX_RECORDS;
  /* Hardware timestamps where the GPU has them (Blackwell): CUPTI then instruments no launch. Elsewhere it
   * answers NOT_SUPPORTED and the window is traced as before. GPU_SPATIAL_TRACE_HW=0: never asked. */
  if (cupti.hw_trace && !switched_off("GPU_SPATIAL_TRACE_HW")) {
    int hw = cupti.hw_trace(1);
    if (debug) fprintf(stderr, "gpu_trace[%d]: hardware trace %s (%d)\n", (int)getpid(), hw == 0 ? "on" : "off", hw);
  }
  int rc = 0;
  size_t enabled = 0;
  double warm = warm_seconds();  /* CUPTI's first launches after it attaches are slow: opt-in, outside */
  double host_start = wall_now();
  if (warm == 0.0) { cupti.timestamp(&lo); window_open((int64_t)lo); }
  for (; enabled < sizeof KINDS / sizeof *KINDS && rc == 0; enabled++)
    rc = check(cupti.enable(KINDS[enabled]), "cuptiActivityEnable");
  STEP("enable");
  if (warm > 0.0) {  /* records of the warm-up come in the window's buffers: clipped to it like any other */
    if (rc == 0) wait_while_wanted(warm, stop, 0);
    host_start = wall_now();
    cupti.timestamp(&lo);
    window_open((int64_t)lo);
    STEP("warm");
  }
  if (rc == 0) wait_while_wanted(seconds, stop, 1);
  STEP("window");
  for (size_t k = 0; k < enabled; k++) cupti.disable(KINDS[k]);
  cupti.timestamp(&hi);
  STEP("disable");
  if (rc == 0) {
    sleep_ns(SETTLE_NS);
    rc = check(cupti.flush_all(1), "cuptiActivityFlushAll");  /* forced: buffers not yet full too */
    STEP("flush");
  }
  window_close();
  if (!switched_off("GPU_SPATIAL_TRACE_DETACH") && cupti.finalize && cupti.finalize() == 0)
    registered = 0;  /* the next window registers again */
  STEP("detach");
  if (rc != 0) { window_free(); return -1; }
  pthread_mutex_lock(&W.lock);
  int64_t end = (int64_t)hi;
  if (W.full) {  /* a full store ends the window where its records are still complete */
    int64_t last = (int64_t)lo;
    for (size_t i = 0; i < W.count; i++) if (W.records[i].end > last) last = W.records[i].end;
    if (last < end) end = last;
  }
  add_backlog((int64_t)lo, end);
  if (add_queue_gaps() != 0) rc = -1;
  int at = snprintf(out, cap, "{\"start\":%.6f,\"end\":%.6f,\"devices\":", host_start,
                    host_start + (double)(end - (int64_t)lo) / 1e9);
  size_t used = 0;
  rc = rc == 0 && at > 0 && (size_t)at < cap ? summarise((int64_t)lo, end, out + at, cap - (size_t)at, &used) : -1;
  if (rc == 0) {
    size_t bytes = W.capacity * sizeof(record_t);
    int more = snprintf(out + at + used, cap - at - used,
                        ",\"records\":%zu,\"refused\":%zu,\"buffer_bytes\":%zu,\"complete\":true,\"native\":true}",
                        W.count, W.refused, bytes);
    if (more < 0 || (size_t)more >= cap - at - used) { set_error("report larger than %zu bytes", cap); rc = -1; }
  }
  pthread_mutex_unlock(&W.lock);
  window_free();
  return rc;
}

/* ---- one client per process: whoever claims it first (the Python hook or the injection) ------------- */
static int claimed;

GT_EXPORT int gt_claim(void) { return __sync_bool_compare_and_swap(&claimed, 0, 1); }

/* A forked child has no client (the parent's thread is not copied): its own hook may claim again. */
static void forget_claim(void) { claimed = 0; }

__attribute__((constructor)) static void at_load(void) { pthread_atfork(NULL, NULL, forget_claim); }

/* ---- the injection's client: gpu_trace/protocol.py over the exporter's socket ------------------------ */
#define MAX_COMMAND_BYTES 256
#define REPORT_BYTES 16384

static int read_line(int fd, char *line, size_t cap) {
  size_t n = 0;
  while (n + 1 < cap) {
    ssize_t got = read(fd, line + n, 1);  /* one byte at a time: a command is a few dozen bytes */
    if (got <= 0) return -1;
    if (line[n] == '\n') { line[n] = 0; return (int)n; }
    n++;
  }
  return -1;  /* longer than any command: not our exporter */
}

/* The number after "key": in a flat JSON object, or -1. */
static double number_after(const char *line, const char *key) {
  char quoted[32];
  snprintf(quoted, sizeof quoted, "\"%s\"", key);
  const char *at = strstr(line, quoted);
  if (!at) return -1;
  at = strchr(at + strlen(quoted), ':');
  if (!at) return -1;
  char *end;
  double v = strtod(at + 1, &end);
  return end == at + 1 ? -1 : v;
}

static void serve(int fd) {
  char line[MAX_COMMAND_BYTES + 2];
  static char body[REPORT_BYTES], report[REPORT_BYTES + 256];
  long pid = (long)getpid();
  while (read_line(fd, line, sizeof line) >= 0) {
    double seconds = number_after(line, "trace"), window = number_after(line, "window");
    if (seconds < 0 || window < 0 || window > 9e15) return;  /* not our exporter: hang up */
    int n;
    if (gt_trace(seconds, NULL, body, sizeof body) == 0)
      n = snprintf(report, sizeof report, "{\"window\":%.0f,\"pid\":%ld,%s\n", window, pid, body + 1);
    else {
      char why[300];
      size_t j = 0;
      for (const char *c = last_error; *c && j < sizeof why - 2; c++) if (*c != '"' && *c != '\\') why[j++] = *c;
      why[j] = 0;
      n = snprintf(report, sizeof report, "{\"window\":%.0f,\"pid\":%ld,\"error\":\"%s\"}\n", window, pid, why);
    }
    if (n <= 0 || (size_t)n >= sizeof report || send(fd, report, (size_t)n, MSG_NOSIGNAL) != n) return;
  }
}

static void *client_thread(void *arg) {
  (void)arg;
  const char *path = getenv("GPU_SPATIAL_TRACE_SOCKET");
  if (!path || !*path) path = "/run/gpu-spatial/cupti.sock";
  static const unsigned retry_s[] = {1, 5, 30};
  for (unsigned attempt = 0;; attempt++) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&addr, sizeof addr) == 0) {
      attempt = 0;
      serve(fd);
    }
    if (fd >= 0) close(fd);
    sleep(retry_s[attempt < 2 ? attempt : 2]);
  }
  return NULL;
}

/* CUDA_INJECTION64_PATH: the driver calls this once, at cuInit. */
GT_EXPORT int InitializeInjection(void) {
  if (!gt_claim()) return 1;  /* a Python hook already traces this process */
  gt_prepare();  /* a missing libcupti is said in the first window's answer */
  pthread_t thread;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  int rc = pthread_create(&thread, &attr, client_thread, NULL);
  pthread_attr_destroy(&attr);
  if (rc != 0) fprintf(stderr, "gpu_trace: the tracing thread could not start: %s\n", strerror(rc));
  return 1;
}
