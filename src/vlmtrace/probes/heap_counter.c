/* Heap bytes in use, counted where malloc is called: loaded with LD_PRELOAD (`vlmtrace run --heap-counter`),
 * it puts itself in front of glibc's allocation functions, forwards every call to glibc's own
 * (__libc_*), and adds or subtracts the chunk's usable size.
 *
 * Why: resident pages (RSS) grow where pages are first touched, so a leak fed by memory the heap had
 * freed grows the process only where the heap next needs fresh pages, in another stage; glibc's own
 * count (mallinfo2) walks every free chunk under the arena's lock (0.35-0.94 ms in a served LMDeploy
 * process, docs/gpu-runs.md). Here a read is a sum of SLOTS counters.
 *
 * Threads add to one of SLOTS cache-line-sized slots (each thread keeps the slot it was given), with
 * relaxed atomics: a free on another thread than the malloc only makes one slot negative, the sum stays
 * right. glibc's own internal allocations go through these symbols too (its manual, "Replacing malloc"),
 * so every chunk that reaches free() was counted by the call that made it. */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <stddef.h>
#include <stdint.h>
#include <unistd.h>

extern void *__libc_malloc(size_t size);
extern void __libc_free(void *pointer);
extern void *__libc_calloc(size_t count, size_t size);
extern void *__libc_realloc(void *pointer, size_t size);
extern void *__libc_memalign(size_t alignment, size_t size);

#define SLOTS 64

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

static inline void *counted(void *pointer) {
    if (pointer)
        count((int64_t)malloc_usable_size(pointer));
    return pointer;
}

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
        count(-(int64_t)malloc_usable_size(pointer));
        __libc_free(pointer);
    }
}

void cfree(void *pointer) { free(pointer); }

void *calloc(size_t count_, size_t size) { return counted(__libc_calloc(count_, size)); }

void *realloc(void *pointer, size_t size) {
    int64_t before = pointer ? (int64_t)malloc_usable_size(pointer) : 0;
    void *moved = __libc_realloc(pointer, size);
    if (moved)
        count((int64_t)malloc_usable_size(moved) - before);
    else if (pointer && size == 0)
        count(-before); /* realloc(p, 0) freed p */
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
