// A fake JVM for tests/tests/hostile_jvms.rs: loads a real libjvm.so with dlopen but never starts
// a VM, so the process maps libjvm (the profiler takes it for a JVM) and libjvm's own data holds
// its real VMStructs tables. It then writes, into its own memory, what the daemon will read:
//
//   fake_jvm LIBJVM SECONDS poison        real tables but ConstMethod::_name_index and
//                                         _signature_index swapped (in a copy of the struct table
//                                         gHotSpotVMStructs is pointed at), and a "ready" VM
//   fake_jvm LIBJVM SECONDS threads TID.. a "ready" VM whose Java thread list holds these tids
//                                         (another process's threads)
//   fake_jvm LIBJVM SECONDS fill          a "ready" VM listing 65,536 tids no process can have
//   fake_jvm LIBJVM SECONDS hostile       a struct table with no end, 10,240 entries of distinct
//                                         255-byte names: as costly to read as a table can be
//   fake_jvm LIBJVM SECONDS alloc IN OUT  a "ready" VM that calls libjvm's allocation events
//                                         (AllocTracer::send_allocation_in_new_tlab at symbol
//                                         value IN, send_allocation_outside_tlab at OUT, hex)
//                                         with garbage: classes and threads that are not there.
//                                         The functions' bodies fault on it; the fault is caught
//                                         and the next call made, until SECONDS are over.
//   fake_jvm LIBJVM SECONDS alloc_flood IN OUT THREADS
//                                         the same as fast as THREADS threads can, each call from
//                                         a new depth of 1 to 900 frames and with a class pointer
//                                         never used before: as many distinct deep stacks as the
//                                         hooks will take (always sampled: 1 GiB each)
//
// "Ready" means what the daemon checks before it pushes a JVM's layout (hotspot/jvm.rs,
// Jvm::code_cache): one code heap, the interpreter, the call stub. None of it is real code; the
// process only sleeps. It prints "ready" once set up and exits after SECONDS.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

// Tids far above PID_MAX_LIMIT (2^22): never a real thread's.
#define MADE_UP_TID_BASE 5000000u
#define FILL_THREADS 65536
// Past the caps of the old daemon (10,000 entries, read 64 at a time, so up to 10,047) and the
// new one (5,000): neither finds an end, and both retry later, as for a JVM still starting.
#define HOSTILE_ENTRIES 10240
#define HOSTILE_NAME_BYTES 256

static void *libjvm;

static void die(const char *what) {
    fprintf(stderr, "fake_jvm: %s\n", what);
    exit(1);
}

// The value of one of libjvm's exported uint64_t or pointer variables.
static uint64_t exported(const char *name) {
    uint64_t *variable = dlsym(libjvm, name);
    if (variable == NULL) {
        fprintf(stderr, "fake_jvm: libjvm lacks %s\n", name);
        exit(1);
    }
    return *variable;
}

// The struct table's columns, as libjvm describes them (vmstructs.rs reads the same variables).
static struct {
    char *table;
    uint64_t stride, type_name, field_name, is_static, offset, address;
} structs;

static void read_struct_layout(void) {
    structs.table = (char *)exported("gHotSpotVMStructs");
    structs.stride = exported("gHotSpotVMStructEntryArrayStride");
    structs.type_name = exported("gHotSpotVMStructEntryTypeNameOffset");
    structs.field_name = exported("gHotSpotVMStructEntryFieldNameOffset");
    structs.is_static = exported("gHotSpotVMStructEntryIsStaticOffset");
    structs.offset = exported("gHotSpotVMStructEntryOffsetOffset");
    structs.address = exported("gHotSpotVMStructEntryAddressOffset");
}

static const char *column_string(const char *entry, uint64_t column) {
    return *(const char *const *)(entry + column);
}

static size_t struct_entries(const char *table) {
    size_t count = 0;
    while (column_string(table + count * structs.stride, structs.type_name) != NULL) {
        count++;
    }
    return count;
}

// The entry of `type_name::field` in `table`, or NULL.
static char *find_entry(char *table, const char *type_name, const char *field) {
    for (char *entry = table; column_string(entry, structs.type_name) != NULL;
         entry += structs.stride) {
        if (strcmp(column_string(entry, structs.type_name), type_name) == 0 &&
            strcmp(column_string(entry, structs.field_name), field) == 0) {
            return entry;
        }
    }
    return NULL;
}

// The entry of the first of two names a field has had (HotSpot renamed some).
static char *field_entry(const char *type_name, const char *field, const char *other_type) {
    char *entry = find_entry(structs.table, type_name, field);
    if (entry == NULL && other_type != NULL) {
        entry = find_entry(structs.table, other_type, field);
    }
    if (entry == NULL) {
        fprintf(stderr, "fake_jvm: no %s::%s in VMStructs\n", type_name, field);
        exit(1);
    }
    return entry;
}

// Byte offset of a field in its type.
static uint64_t field_offset(const char *type_name, const char *field, const char *other_type) {
    return *(uint64_t *)(field_entry(type_name, field, other_type) + structs.offset);
}

// Where a static field lives: in libjvm's own .data or .bss, writable.
static void *static_field(const char *type_name, const char *field) {
    return *(void **)(field_entry(type_name, field, NULL) + structs.address);
}

// A zeroed object big enough for any field offset VMStructs gives for it.
static char *fake_object(void) {
    char *object = calloc(1, 4096);
    if (object == NULL) {
        die("out of memory");
    }
    return object;
}

static void put_u64(char *base, uint64_t offset, uint64_t value) {
    memcpy(base + offset, &value, sizeof value);
}

static void put_u32(char *base, uint64_t offset, uint32_t value) {
    memcpy(base + offset, &value, sizeof value);
}

// Makes the VM look initialised, its Java thread list holding `count` threads with these tids.
static void fake_runtime(const uint32_t *tids, size_t count) {
    // One code heap over an inaccessible reservation: plausible ranges, no code.
    size_t heap_bytes = 1 << 20;
    char *code = mmap(NULL, heap_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (code == MAP_FAILED) {
        die("mmap failed");
    }
    uint64_t low = (uint64_t)code, high = low + heap_bytes;
    char *segmap = fake_object();
    char *heap = fake_object();
    uint64_t memory = field_offset("CodeHeap", "_memory", NULL);
    uint64_t segmap_space = field_offset("CodeHeap", "_segmap", NULL);
    put_u64(heap, memory + field_offset("VirtualSpace", "_low_boundary", NULL), low);
    put_u64(heap, memory + field_offset("VirtualSpace", "_high_boundary", NULL), high);
    put_u64(heap, memory + field_offset("VirtualSpace", "_low", NULL), low);
    put_u64(heap, memory + field_offset("VirtualSpace", "_high", NULL), high);
    put_u64(heap, segmap_space + field_offset("VirtualSpace", "_low", NULL), (uint64_t)segmap);
    put_u32(heap, field_offset("CodeHeap", "_log2_segment_size", NULL), 7);

    char **heaps = calloc(1, sizeof(char *));
    heaps[0] = heap;
    char *heap_array = fake_object();
    put_u32(heap_array, field_offset("GrowableArrayBase", "_len", "GenericGrowableArray"), 1);
    put_u64(heap_array, field_offset("GrowableArray<int>", "_data", NULL), (uint64_t)heaps);
    *(char **)static_field("CodeCache", "_heaps") = heap_array;
    *(uint64_t *)static_field("CodeCache", "_low_bound") = low;
    *(uint64_t *)static_field("CodeCache", "_high_bound") = high;

    char *interpreter = fake_object();
    put_u64(interpreter, field_offset("StubQueue", "_stub_buffer", NULL), low);
    put_u32(interpreter, field_offset("StubQueue", "_buffer_limit", NULL), 4096);
    *(char **)static_field("AbstractInterpreter", "_code") = interpreter;
    *(uint64_t *)static_field("StubRoutines", "_call_stub_return_address") = low + 8192;

    // Threads and their OSThreads packed 16 bytes apart: the daemon reads one pointer of each
    // JavaThread (its OSThread) and one int of each OSThread (its tid), nothing else.
    uint64_t osthread_at = field_offset("Thread", "_osthread", "JavaThread");
    uint64_t tid_at = field_offset("OSThread", "_thread_id", NULL);
    char *threads = calloc(count * 16 + osthread_at + 16, 1);
    char *osthreads = calloc(count * 16 + tid_at + 16, 1);
    uint64_t *listed = calloc(count + 1, sizeof(uint64_t));
    if (threads == NULL || osthreads == NULL || listed == NULL) {
        die("out of memory");
    }
    for (size_t i = 0; i < count; i++) {
        put_u64(threads, 16 * i + osthread_at, (uint64_t)(osthreads + 16 * i));
        put_u32(osthreads, 16 * i + tid_at, tids[i]);
        listed[i] = (uint64_t)(threads + 16 * i);
    }
    char *list = fake_object();
    put_u32(list, field_offset("ThreadsList", "_length", NULL), (uint32_t)count);
    put_u64(list, field_offset("ThreadsList", "_threads", NULL), (uint64_t)listed);
    *(char **)static_field("ThreadsSMRSupport", "_java_thread_list") = list;
}

// Points gHotSpotVMStructs at a copy of the struct table whose ConstMethod name and signature
// indexes trade offsets: whoever trusts this layout reads each method's signature as its name.
static void poison_layout(void) {
    size_t bytes = (struct_entries(structs.table) + 1) * structs.stride;
    char *copy = malloc(bytes);
    if (copy == NULL) {
        die("out of memory");
    }
    memcpy(copy, structs.table, bytes);
    char *name = find_entry(copy, "ConstMethod", "_name_index");
    char *signature = find_entry(copy, "ConstMethod", "_signature_index");
    if (name == NULL || signature == NULL) {
        die("no ConstMethod indexes in VMStructs");
    }
    uint64_t name_offset = *(uint64_t *)(name + structs.offset);
    *(uint64_t *)(name + structs.offset) = *(uint64_t *)(signature + structs.offset);
    *(uint64_t *)(signature + structs.offset) = name_offset;
    *(char **)dlsym(libjvm, "gHotSpotVMStructs") = copy;
}

// Points gHotSpotVMStructs at a table with no end whose every entry names a new type and field.
static void hostile_layout(void) {
    size_t names = 2 * HOSTILE_ENTRIES;
    char *table = calloc(HOSTILE_ENTRIES, structs.stride);
    char *strings = malloc(names * HOSTILE_NAME_BYTES);
    if (table == NULL || strings == NULL) {
        die("out of memory");
    }
    for (size_t i = 0; i < names; i++) {
        char *name = strings + i * HOSTILE_NAME_BYTES;
        memset(name, 'A' + (char)(i % 26), HOSTILE_NAME_BYTES - 1);
        name[HOSTILE_NAME_BYTES - 1] = '\0';
        snprintf(name, 16, "N%09zu", i);
        name[10] = '_';
    }
    for (size_t i = 0; i < HOSTILE_ENTRIES; i++) {
        char *entry = table + i * structs.stride;
        char *type_name = strings + 2 * i * HOSTILE_NAME_BYTES;
        char *field = type_name + HOSTILE_NAME_BYTES;
        memcpy(entry + structs.type_name, &type_name, sizeof type_name);
        memcpy(entry + structs.field_name, &field, sizeof field);
    }
    *(char **)dlsym(libjvm, "gHotSpotVMStructs") = table;
}

static __thread sigjmp_buf fault_return;

static void on_fault(int signal) {
    siglongjmp(fault_return, signal);
}

static void catch_faults(void) {
    struct sigaction action = {0};
    action.sa_handler = on_fault;
    action.sa_flags = SA_NODEFER;
    sigaction(SIGSEGV, &action, NULL);
    sigaction(SIGBUS, &action, NULL);
    sigaction(SIGILL, &action, NULL);
}

// The allocation event taking a new TLAB, at its symbol value `offset` in the loaded libjvm.
typedef void (*in_new_tlab_fn)(void *, void *, size_t, size_t, void *);

static in_new_tlab_fn in_new_tlab_at(uint64_t offset) {
    Dl_info info;
    if (dladdr(dlsym(libjvm, "gHotSpotVMStructs"), &info) == 0) {
        die("dladdr");
    }
    return (in_new_tlab_fn)((char *)info.dli_fbase + offset);
}

struct flood {
    in_new_tlab_fn in_tlab;
    time_t end;
    unsigned seed;
};

// Calls the event `depth` frames below here (each frame kept: the walk follows them all).
// Words a flooding thread hands the event as its `JavaThread*`: each grows by 1 GiB before
// every call, so that whichever of them the hook reads as the thread's allocated-bytes counter,
// every event claims a GiB allocated since the last (always sampled).
#define THREAD_WORDS 1024

static __attribute__((noinline)) void call_deep(const struct flood *flood, unsigned depth,
                                                char *klass, uint64_t *thread) {
    volatile char frame[16];
    frame[0] = (char)depth;
    if (depth > 1) {
        call_deep(flood, depth - 1, klass, thread);
    } else if (sigsetjmp(fault_return, 1) == 0) {
        for (unsigned i = 0; i < THREAD_WORDS; i++) {
            thread[i] += (uint64_t)1 << 30;
        }
        flood->in_tlab(klass, klass, (size_t)1 << 30, 64, thread);
    }
    frame[1] = frame[0];
}

static void *flood_thread(void *argument) {
    struct flood flood = *(struct flood *)argument;
    // Class pointers never repeated: 16 MiB of them, 8 bytes apart.
    char *classes = malloc(16 << 20);
    uint64_t *thread = calloc(THREAD_WORDS, sizeof(uint64_t));
    if (classes == NULL || thread == NULL) {
        die("out of memory");
    }
    for (unsigned long call = 0; time(NULL) < flood.end; call++) {
        unsigned depth = 1 + rand_r(&flood.seed) % 900;
        call_deep(&flood, depth, classes + (call * 8) % (16 << 20), thread);
    }
    return NULL;
}

// Floods the allocation hooks from `threads` threads until `seconds` are over.
static void flood_allocation_events(uint64_t in_new_tlab, unsigned threads, unsigned seconds) {
    catch_faults();
    pthread_t running[64];
    struct flood floods[64];
    if (threads > 64) {
        threads = 64;
    }
    for (unsigned i = 0; i < threads; i++) {
        floods[i] = (struct flood){in_new_tlab_at(in_new_tlab), time(NULL) + seconds, i + 1};
        pthread_create(&running[i], NULL, flood_thread, &floods[i]);
    }
    for (unsigned i = 0; i < threads; i++) {
        pthread_join(running[i], NULL);
    }
}

// The garbage a hostile process can hand its own allocation events: no class, an unmapped one,
// one whose bytes are random.
static void call_allocation_events(uint64_t in_new_tlab, uint64_t outside_tlab, unsigned seconds) {
    Dl_info info;
    if (dladdr(dlsym(libjvm, "gHotSpotVMStructs"), &info) == 0) {
        die("dladdr");
    }
    // A shared library's symbol values are offsets from where it is loaded.
    typedef void (*in_new_tlab_fn)(void *, void *, size_t, size_t, void *);
    typedef void (*outside_tlab_fn)(void *, void *, size_t, void *);
    in_new_tlab_fn in_tlab = (in_new_tlab_fn)((char *)info.dli_fbase + in_new_tlab);
    outside_tlab_fn outside = (outside_tlab_fn)((char *)info.dli_fbase + outside_tlab);
    struct sigaction action = {0};
    action.sa_handler = on_fault;
    action.sa_flags = SA_NODEFER;
    sigaction(SIGSEGV, &action, NULL);
    sigaction(SIGBUS, &action, NULL);
    sigaction(SIGILL, &action, NULL);
    static uint64_t random_bytes[64];
    for (size_t i = 0; i < 64; i++) {
        random_bytes[i] = 0x9e3779b97f4a7c15ull * (i + 1);
    }
    void *classes[] = {NULL, (void *)0xdead0000ull, random_bytes};
    time_t end = time(NULL) + seconds;
    for (unsigned long call = 0; time(NULL) < end; call++) {
        void *klass = classes[call % 3];
        // Sizes over any sampling interval: every call is sampled.
        if (sigsetjmp(fault_return, 1) == 0) {
            if (call % 2 == 0) {
                in_tlab(klass, random_bytes, 1 << 30, 64, random_bytes);
            } else {
                outside(klass, random_bytes, 1 << 30, (void *)0xdead0000ull);
            }
        }
        usleep(1000);
    }
}

int main(int argc, char **argv) {
    if (argc < 4) {
        die("usage: fake_jvm LIBJVM SECONDS poison|threads TID...|fill|hostile|alloc IN OUT");
    }
    // Loading runs libjvm's static initialisers (they fill the VMStructs offset variables);
    // JNI_CreateJavaVM is never called.
    libjvm = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (libjvm == NULL) {
        die(dlerror());
    }
    read_struct_layout();
    const char *mode = argv[3];
    if (strcmp(mode, "poison") == 0) {
        fake_runtime(NULL, 0);
        poison_layout();
    } else if (strcmp(mode, "threads") == 0) {
        size_t count = (size_t)(argc - 4);
        uint32_t *tids = calloc(count + 1, sizeof(uint32_t));
        for (size_t i = 0; i < count; i++) {
            tids[i] = (uint32_t)strtoul(argv[4 + i], NULL, 10);
        }
        fake_runtime(tids, count);
    } else if (strcmp(mode, "fill") == 0) {
        uint32_t *tids = calloc(FILL_THREADS, sizeof(uint32_t));
        for (uint32_t i = 0; i < FILL_THREADS; i++) {
            tids[i] = MADE_UP_TID_BASE + i;
        }
        fake_runtime(tids, FILL_THREADS);
    } else if (strcmp(mode, "hostile") == 0) {
        hostile_layout();
    } else if (strcmp(mode, "alloc_flood") == 0 && argc == 7) {
        fake_runtime(NULL, 0);
        printf("ready\n");
        fflush(stdout);
        flood_allocation_events(strtoull(argv[4], NULL, 16), (unsigned)atoi(argv[6]),
                                (unsigned)atoi(argv[2]));
        return 0;
    } else if (strcmp(mode, "alloc") == 0 && argc == 6) {
        fake_runtime(NULL, 0);
        printf("ready\n");
        fflush(stdout);
        call_allocation_events(strtoull(argv[4], NULL, 16), strtoull(argv[5], NULL, 16),
                               (unsigned)atoi(argv[2]));
        return 0;
    } else {
        die("unknown mode");
    }
    printf("ready\n");
    fflush(stdout);
    sleep((unsigned)atoi(argv[2]));
    return 0;
}
