/* Heap bytes in use, counted where malloc is called: loaded with LD_PRELOAD (`vlmtrace run --heap-counter`),
 * it puts itself in front of glibc's allocation functions, forwards every call to glibc's own
 * (__libc_*), and adds or subtracts the chunk's usable size.
 *
 * Why: resident pages (RSS) grow where pages are first touched, so a leak fed by memory the heap had
 * freed grows the process only where the heap next needs fresh pages, in another stage; glibc's own
 * count (mallinfo2) walks every free chunk under the arena's lock (0.35-0.94 ms in a served LMDeploy
 * process, docs/gpu.md). Here a read is a sum of SLOTS counters.
 *
 * Threads add to one of SLOTS cache-line-sized slots (each thread keeps the slot it was given), with
 * relaxed atomics: a free on another thread than the malloc only makes one slot negative, the sum stays
 * right. glibc's own internal allocations go through these symbols too (its manual, "Replacing malloc"),
 * so every chunk that reaches free() was counted by the call that made it.
 *
 * Large chunks (LARGE_BYTES and up) are also charged to the stage that allocated them, as the thread
 * said it was in (vlmtrace_heap_set_stage, from vlmtrace's span boundaries), until they are freed,
 * whichever thread or stage frees them: a stage that frees what another handed it (TurboMind's engine
 * stream freeing the vision stage's buffers) gives the bytes back to the stage that allocated them.
 * The chunks' tags live in a fixed open-addressing table under a spin lock: large chunks are few (image
 * buffers, tensors, a leak's blocks) and the lock is held for a probe or two. A chunk that finds the
 * table full is not charged to any stage (`vlmtrace_heap_untagged` counts them).
 *
 * Each tagged chunk also keeps when it was allocated, and the bytes still in use are kept by stage and by
 * that time (`vlmtrace_heap_survivors`): BUCKETS intervals of equal width from the first large chunk on,
 * the width doubled (neighbours merged) whenever a chunk is born past the last. What a stage allocated long
 * ago and still holds is what it kept; a working set freed later, a cache that drops its oldest entries and
 * the work in flight leave their early intervals empty (docs/analysis.md, "What each stage kept"). */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

extern void *__libc_malloc(size_t size);
extern void __libc_free(void *pointer);
extern void *__libc_calloc(size_t count, size_t size);
extern void *__libc_realloc(void *pointer, size_t size);
extern void *__libc_memalign(size_t alignment, size_t size);

#define SLOTS 64
#define STAGES 32
#define LARGE_BYTES (64 * 1024)

struct slot {
    int64_t bytes;
    char padding[64 - sizeof(int64_t)];
};

static struct slot slots[SLOTS] __attribute__((aligned(64)));
static unsigned next_slot;
static __thread int my_slot __attribute__((tls_model("initial-exec"))) = -1;

static inline void count(int64_t bytes) {
    if (my_slot < 0)
        my_slot = (int)(__atomic_fetch_add(&next_slot, 1, __ATOMIC_RELAXED) % SLOTS);
    __atomic_fetch_add(&slots[my_slot].bytes, bytes, __ATOMIC_RELAXED);
}

static void tag_chunk(uintptr_t chunk, int64_t bytes);
static void untag_chunk(uintptr_t chunk, int64_t bytes);

static inline void *counted(void *pointer) {
    if (pointer) {
        int64_t bytes = (int64_t)malloc_usable_size(pointer);
        count(bytes);
        if (bytes >= LARGE_BYTES)
            tag_chunk((uintptr_t)pointer, bytes);
    }
    return pointer;
}

static inline void uncounted(void *pointer, int64_t bytes) {
    count(-bytes);
    if (bytes >= LARGE_BYTES)
        untag_chunk((uintptr_t)pointer, bytes);
}

#define TABLE_SIZE (1 << 16) /* a power of two; filled to TABLE_FULL at most, so probes stay short */
#define TABLE_FULL (TABLE_SIZE / 4 * 3)

struct tag {
    uintptr_t chunk; /* 0: empty */
    int stage;
    uint32_t born; /* ms after born_origin_ms */
};

#define BUCKETS 256
#define FIRST_WIDTH_MS 16

static struct tag tags[TABLE_SIZE];
static unsigned tagged;
static int64_t stage_bytes[STAGES];
static int64_t survivors[STAGES][BUCKETS];
static int64_t born_origin_ms = -1; /* CLOCK_MONOTONIC, at the first large chunk */
static uint32_t bucket_width_ms = FIRST_WIDTH_MS;
static int64_t untagged;
static volatile int table_lock;
static __thread int my_stage __attribute__((tls_model("initial-exec")));

/* Held for a probe or two; a holder that the scheduler took off its core is waited for without spinning. */
static inline void lock_table(void) {
    unsigned spins = 0;
    while (__atomic_exchange_n(&table_lock, 1, __ATOMIC_ACQUIRE))
        while (__atomic_load_n(&table_lock, __ATOMIC_RELAXED))
            if (++spins % 128 == 0)
                sched_yield();
}

static inline void unlock_table(void) { __atomic_store_n(&table_lock, 0, __ATOMIC_RELEASE); }

/* A fork() while another thread holds the lock would leave it held in the child for good. */
static void unlock_in_child(void) { table_lock = 0; }

__attribute__((constructor)) static void install_fork_handler(void) {
    pthread_atfork(lock_table, unlock_table, unlock_in_child);
}

static int64_t now_ms(clockid_t clock) {
    struct timespec now;
    clock_gettime(clock, &now);
    return (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000;
}

/* Under the table's lock: ms since the first large chunk, the bucket width doubled until it has a bucket. */
static uint32_t born_now(void) {
    int64_t now = now_ms(CLOCK_MONOTONIC);
    if (born_origin_ms < 0)
        born_origin_ms = now;
    uint32_t born = (uint32_t)(now - born_origin_ms);
    while (born / bucket_width_ms >= BUCKETS) {
        for (int stage = 0; stage < STAGES; stage++) {
            for (int bucket = 0; bucket < BUCKETS / 2; bucket++)
                survivors[stage][bucket] = survivors[stage][2 * bucket] + survivors[stage][2 * bucket + 1];
            for (int bucket = BUCKETS / 2; bucket < BUCKETS; bucket++)
                survivors[stage][bucket] = 0;
        }
        bucket_width_ms *= 2;
    }
    return born;
}

static inline unsigned home(uintptr_t chunk) {
    return (unsigned)((chunk >> 4) * 0x9E3779B97F4A7C15ull >> 48) & (TABLE_SIZE - 1);
}

static void tag_chunk(uintptr_t chunk, int64_t bytes) {
    int stage = my_stage;
    lock_table();
    if (tagged >= TABLE_FULL) {
        unlock_table();
        __atomic_fetch_add(&untagged, 1, __ATOMIC_RELAXED);
        return;
    }
    unsigned index = home(chunk);
    while (tags[index].chunk)
        index = (index + 1) & (TABLE_SIZE - 1);
    uint32_t born = born_now();
    tags[index].chunk = chunk;
    tags[index].stage = stage;
    tags[index].born = born;
    tagged++;
    stage_bytes[stage] += bytes;
    survivors[stage][born / bucket_width_ms] += bytes;
    unlock_table();
}

/* Linear probing's deletion without tombstones: later entries of the same run move back into the gap. */
static void untag_chunk(uintptr_t chunk, int64_t bytes) {
    lock_table();
    unsigned index = home(chunk);
    while (tags[index].chunk && tags[index].chunk != chunk)
        index = (index + 1) & (TABLE_SIZE - 1);
    if (!tags[index].chunk) { /* never tagged: the table was full when it was made */
        unlock_table();
        return;
    }
    stage_bytes[tags[index].stage] -= bytes;
    survivors[tags[index].stage][tags[index].born / bucket_width_ms] -= bytes;
    tagged--;
    unsigned gap = index;
    for (unsigned next = (gap + 1) & (TABLE_SIZE - 1); tags[next].chunk; next = (next + 1) & (TABLE_SIZE - 1)) {
        unsigned wanted = home(tags[next].chunk);
        /* the entry may fill the gap unless its home lies cyclically in (gap, next] */
        if (((next - wanted) & (TABLE_SIZE - 1)) >= ((next - gap) & (TABLE_SIZE - 1))) {
            tags[gap] = tags[next];
            gap = next;
        }
    }
    tags[gap].chunk = 0;
    unlock_table();
}

/* Where the calling thread keeps the stage its allocations are charged to (0: none of vlmtrace's stages,
 * at most STAGES - 1): the caller writes it there directly, a store instead of a call per stage change. */
int *vlmtrace_heap_stage_slot(void) { return &my_stage; }

/* The large chunks' bytes in use by the stage that allocated them: `out` gets `count` (at most STAGES) values. */
void vlmtrace_heap_by_stage(int64_t *out, int count) {
    lock_table();
    for (int stage = 0; stage < count && stage < STAGES; stage++)
        out[stage] = stage_bytes[stage];
    unlock_table();
}

/* The large chunks' bytes in use by allocating stage and by when they were allocated: `out` gets `count`
 * (at most STAGES) rows of BUCKETS values, bucket b holding the chunks born from origin + b * width ms on;
 * `meta` gets the origin (unix ms; -1: no large chunk yet), the width (ms) and BUCKETS. */
void vlmtrace_heap_survivors(int64_t *out, int count, int64_t *meta) {
    lock_table();
    for (int stage = 0; stage < count && stage < STAGES; stage++)
        for (int bucket = 0; bucket < BUCKETS; bucket++)
            out[stage * BUCKETS + bucket] = survivors[stage][bucket];
    meta[0] = born_origin_ms < 0 ? -1 : now_ms(CLOCK_REALTIME) - (now_ms(CLOCK_MONOTONIC) - born_origin_ms);
    meta[1] = bucket_width_ms;
    meta[2] = BUCKETS;
    unlock_table();
}

int64_t vlmtrace_heap_untagged(void) { return __atomic_load_n(&untagged, __ATOMIC_RELAXED); }

/* The bytes in use: what the calls counted so far made minus what they freed. */
int64_t vlmtrace_heap_in_use(void) {
    int64_t total = 0;
    for (int index = 0; index < SLOTS; index++)
        total += __atomic_load_n(&slots[index].bytes, __ATOMIC_RELAXED);
    return total;
}

void *malloc(size_t size) { return counted(__libc_malloc(size)); }

void free(void *pointer) {
    if (pointer) {
        uncounted(pointer, (int64_t)malloc_usable_size(pointer));
        __libc_free(pointer);
    }
}

void cfree(void *pointer) { free(pointer); }

void *calloc(size_t count_, size_t size) { return counted(__libc_calloc(count_, size)); }

/* A chunk realloc moved or resized is charged anew, to the stage that resized it. */
void *realloc(void *pointer, size_t size) {
    int64_t before = pointer ? (int64_t)malloc_usable_size(pointer) : 0;
    if (pointer)
        uncounted(pointer, before);
    void *moved = __libc_realloc(pointer, size);
    if (moved)
        counted(moved);
    else if (pointer && size != 0)
        counted(pointer); /* it failed: the old chunk is still there, and still in use */
    return moved;
}

void *reallocarray(void *pointer, size_t count_, size_t size) {
    size_t total;
    if (__builtin_mul_overflow(count_, size, &total)) {
        errno = ENOMEM;
        return NULL;
    }
    return realloc(pointer, total);
}

void *memalign(size_t alignment, size_t size) { return counted(__libc_memalign(alignment, size)); }

void *aligned_alloc(size_t alignment, size_t size) { return memalign(alignment, size); }

int posix_memalign(void **out, size_t alignment, size_t size) {
    if (alignment % sizeof(void *) != 0 || (alignment & (alignment - 1)) != 0)
        return EINVAL;
    void *pointer = memalign(alignment, size);
    if (!pointer)
        return ENOMEM;
    *out = pointer;
    return 0;
}

void *valloc(size_t size) { return memalign((size_t)sysconf(_SC_PAGESIZE), size); }

void *pvalloc(size_t size) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    return memalign(page, (size + page - 1) & ~(page - 1));
}
