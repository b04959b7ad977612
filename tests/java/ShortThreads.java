import java.lang.management.ManagementFactory;
import java.time.Instant;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.ReentrantLock;

// Threads that live briefly, each measuring its own lock waits and allocations:
//   launcher        starts a thread every START_EVERY_MS, whose lifetime cycles over LIFETIMES_MS
//                   (100 ms, 300 ms, 1 s, 3 s): about 37 alive at a time;
//   short-<n>       the short threads. For its life each loops over:
//     allocSmall    1 to 2 x SMALL_PER_BATCH - 1 byte[SMALL_LENGTH] (20 KB on average);
//     allocLarge    0 to 2 x LARGE_PER_BATCH byte[LARGE_LENGTH] (33 KB on average);
//     monitorSite   enter `synchronized (MONITOR)`, shared by all, hold it HOLD_MS;
//     (a random pause)
//     parkSite      take LOCK, a shared fair ReentrantLock (its waiters park in Unsafe.park),
//                   hold it HOLD_MS;
//     jniSite       JniCallback.nativeOuter(1) (tests/workloads/jni_callback.c, its library's path
//                   in the `jni.lib` property): about 0.3 ms of CPU in a JNI library and the
//                   Java method it calls back;
//     (a random pause).
// The batches' sizes are drawn anew each round: HotSpot's allocation sampler draws the distances
// between its sample points from one generator that all threads share and that each new thread
// reseeds from its own address, and the addresses of ended threads come back, so the same few
// runs of distances recur; over rounds of a fixed size they fell on the same offsets, hence the
// same site, again and again (the small site's share was off by up to 5 pp, a different way each
// run). Rounds of random sizes spread those offsets over both sites.
// A new thread allocates first (its first TLAB is taken in allocSmall, as a request handler's
// first objects are), then goes for the monitor, microseconds after its start: its first waits
// are in its first milliseconds. A round takes about 190 ms: a 100 ms thread lives one round or
// part of one, a 3 s one about sixteen.
//
// The holders sleep while holding, so contention costs next to no CPU; the pauses (PAUSE_MIN_MS
// to PAUSE_MAX_MS, drawn anew each time) keep each lock busy about two thirds of the time (some
// 220 entries a second) and make the arrivals irregular, so waits range from none to tens of
// milliseconds across the thresholds below. A pause sits between the two locks so the monitor,
// which lets threads out one every HOLD_MS, does not line them up for the ReentrantLock (which
// would then never be contended).
// The lock is fair: a woken waiter gets it, so each wait for it is one park, from
// `Unsafe.park` to its return, which is what a park wait is (docs/lock-profiling.md). A
// non-fair lock lets a newcomer barge in and sends the woken waiter back to park: its `lock()`
// is then several park waits, which the profiles count apart. The monitor does the same, and
// there the whole entry is one wait (the profiles follow it across its blocks).
//
// The truth, all cumulative since the launcher started, over all short threads alive or ended:
//   - locks: for every entry, the time from just before `synchronized` / `lock()` to just inside,
//     measured with System.nanoTime() by the entering thread, which adds it at once (before
//     holding) to the totals of each threshold of THRESHOLDS_NS it reaches: total nanoseconds
//     and number of waits at or over 0, 2 ms and 10 ms;
//   - allocations: bytes per site, counted per object allocated at the size the JVM's own
//     per-thread counter gives it (array length + 16-byte header, checked before "ready"),
//     added after each batch.
// The main thread prints them with the wall clock (nanoseconds since the epoch) every 100 ms:
//   SHORT <epoch ns> monitor_ns_0=<ns> monitor_waits_0=<n> monitor_ns_2ms=... monitor_ns_10ms=...
//         park_ns_0=... (the same for park) small=<bytes> large=<bytes> started=<threads>
//         jni=<calls>
// Prints "ready" first, once the JNI library is loaded and the object sizes are checked.
public class ShortThreads {
    static final long START_EVERY_MS = 30;
    static final long[] LIFETIMES_MS = {100, 300, 1000, 3000};
    static final long HOLD_MS = 3;
    static final long PAUSE_MIN_MS = 20;
    static final long PAUSE_MAX_MS = 150;
    static final long[] THRESHOLDS_NS = {0, 2_000_000, 10_000_000};
    static final String[] THRESHOLD_NAMES = {"0", "2ms", "10ms"};

    static final int SMALL_LENGTH = 64;
    static final int SMALL_PER_BATCH = 256;
    static final int LARGE_LENGTH = 16 << 10;
    static final int LARGE_PER_BATCH = 2;
    /** An array's header: mark word, compressed class pointer, length (see checkSizes). */
    static final int ARRAY_HEADER = 16;

    static final Object MONITOR = new Object();
    static final ReentrantLock LOCK = new ReentrantLock(true);

    /** The waits of one lock, per threshold: added to by every short thread. */
    static final class Waits {
        final String name;
        final AtomicLong[] nanos = new AtomicLong[THRESHOLDS_NS.length];
        final AtomicLong[] count = new AtomicLong[THRESHOLDS_NS.length];

        Waits(String name) {
            this.name = name;
            for (int i = 0; i < THRESHOLDS_NS.length; i++) {
                nanos[i] = new AtomicLong();
                count[i] = new AtomicLong();
            }
        }

        void add(long waited) {
            for (int i = 0; i < THRESHOLDS_NS.length; i++) {
                if (waited >= THRESHOLDS_NS[i]) {
                    nanos[i].addAndGet(waited);
                    count[i].incrementAndGet();
                }
            }
        }

        String totals() {
            StringBuilder line = new StringBuilder();
            for (int i = 0; i < THRESHOLDS_NS.length; i++) {
                line.append(' ').append(name).append("_ns_").append(THRESHOLD_NAMES[i]).append('=')
                        .append(nanos[i].get());
                line.append(' ').append(name).append("_waits_").append(THRESHOLD_NAMES[i])
                        .append('=').append(count[i].get());
            }
            return line.toString();
        }
    }

    static final Waits MONITOR_WAITS = new Waits("monitor");
    static final Waits PARK_WAITS = new Waits("park");
    static final AtomicLong SMALL_BYTES = new AtomicLong();
    static final AtomicLong LARGE_BYTES = new AtomicLong();
    static final AtomicLong STARTED = new AtomicLong();
    static final AtomicLong JNI_CALLS = new AtomicLong();

    /** Every array escapes through it, so the JIT cannot eliminate the allocation. */
    static volatile byte[] sink;
    static volatile long jniSink;

    static void monitorSite() throws InterruptedException {
        long before = System.nanoTime();
        synchronized (MONITOR) {
            MONITOR_WAITS.add(System.nanoTime() - before);
            Thread.sleep(HOLD_MS);
        }
    }

    static void parkSite() throws InterruptedException {
        long before = System.nanoTime();
        LOCK.lock();
        try {
            PARK_WAITS.add(System.nanoTime() - before);
            Thread.sleep(HOLD_MS);
        } finally {
            LOCK.unlock();
        }
    }

    static void allocSmall(int count) {
        for (int i = 0; i < count; i++) {
            sink = new byte[SMALL_LENGTH];
        }
    }

    static void allocLarge(int count) {
        for (int i = 0; i < count; i++) {
            sink = new byte[LARGE_LENGTH];
        }
    }

    static void jniSite() {
        jniSink += JniCallback.nativeOuter(1);
    }

    /** Sleeps a random pause, cut at the thread's end (System.nanoTime()); false once past it. */
    static boolean pause(long end) throws InterruptedException {
        long pause =
                ThreadLocalRandom.current().nextLong(PAUSE_MIN_MS, PAUSE_MAX_MS + 1) * 1_000_000;
        long left = end - System.nanoTime();
        if (left <= 0) {
            return false;
        }
        long nanos = Math.min(pause, left);
        Thread.sleep(nanos / 1_000_000, (int) (nanos % 1_000_000));
        return System.nanoTime() < end;
    }

    static void live(long lifetimeMs) throws InterruptedException {
        long end = System.nanoTime() + lifetimeMs * 1_000_000;
        ThreadLocalRandom random = ThreadLocalRandom.current();
        while (true) {
            int small = random.nextInt(1, 2 * SMALL_PER_BATCH);
            allocSmall(small);
            SMALL_BYTES.addAndGet((long) small * (SMALL_LENGTH + ARRAY_HEADER));
            int large = random.nextInt(0, 2 * LARGE_PER_BATCH + 1);
            allocLarge(large);
            LARGE_BYTES.addAndGet((long) large * (LARGE_LENGTH + ARRAY_HEADER));
            monitorSite();
            if (!pause(end)) {
                return;
            }
            parkSite();
            jniSite();
            JNI_CALLS.incrementAndGet();
            if (!pause(end)) {
                return;
            }
        }
    }

    /** Starts a short thread every START_EVERY_MS: a late wake-up shortens the next sleep. */
    static void launch() throws InterruptedException {
        long started = System.nanoTime();
        for (long n = 0; ; n++) {
            long lifetime = LIFETIMES_MS[(int) (n % LIFETIMES_MS.length)];
            Thread thread = new Thread(() -> {
                try {
                    live(lifetime);
                } catch (InterruptedException e) {
                    // Never interrupted: the JVM is killed.
                }
            }, "short-" + n);
            thread.setDaemon(true);
            thread.start();
            STARTED.incrementAndGet();
            long due = started + (n + 1) * START_EVERY_MS * 1_000_000;
            long early = due - System.nanoTime();
            if (early > 0) {
                Thread.sleep(early / 1_000_000, (int) (early % 1_000_000));
            }
        }
    }

    /**
     * Null if the JVM's per-thread allocation counter gives each array of the sites the size
     * the truth counts it at (length + ARRAY_HEADER), else what it gives. Each site is run once
     * first, so that what its first call loads or compiles is not counted.
     */
    static String checkSizes() {
        com.sun.management.ThreadMXBean threads =
                (com.sun.management.ThreadMXBean) ManagementFactory.getThreadMXBean();
        long id = Thread.currentThread().getId();
        allocSmall(SMALL_PER_BATCH);
        allocLarge(LARGE_PER_BATCH);
        long before = threads.getThreadAllocatedBytes(id);
        int batches = 20;
        for (int i = 0; i < batches; i++) {
            allocSmall(SMALL_PER_BATCH);
        }
        long between = threads.getThreadAllocatedBytes(id);
        for (int i = 0; i < batches; i++) {
            allocLarge(LARGE_PER_BATCH);
        }
        long after = threads.getThreadAllocatedBytes(id);
        // The counter's own call may allocate a few dozen bytes (JDK 11): rounding to the 8-byte
        // object alignment leaves them out.
        long small = Math.round((between - before) / 8.0 / (batches * SMALL_PER_BATCH)) * 8;
        long large = Math.round((after - between) / 8.0 / (batches * LARGE_PER_BATCH)) * 8;
        if (small == SMALL_LENGTH + ARRAY_HEADER && large == LARGE_LENGTH + ARRAY_HEADER) {
            return null;
        }
        return "byte[" + SMALL_LENGTH + "] takes " + small + " bytes, byte[" + LARGE_LENGTH
                + "] " + large + ": not the length + " + ARRAY_HEADER + " the truth counts";
    }

    public static void main(String[] args) throws Exception {
        String sizes = checkSizes();
        if (sizes != null) {
            System.out.println(sizes);
            System.exit(1);
        }
        // Loads the JNI library (JniCallback's static initializer) before any short thread runs.
        jniSink += JniCallback.nativeOuter(0);
        Thread launcher = new Thread(() -> {
            try {
                launch();
            } catch (InterruptedException e) {
                // Never interrupted: the JVM is killed.
            }
        }, "launcher");
        launcher.setDaemon(true);
        launcher.start();
        System.out.println("ready");
        System.out.flush();
        while (true) {
            Instant now = Instant.now();
            long nanos = now.getEpochSecond() * 1_000_000_000L + now.getNano();
            System.out.println("SHORT " + nanos + MONITOR_WAITS.totals() + PARK_WAITS.totals()
                    + " small=" + SMALL_BYTES.get() + " large=" + LARGE_BYTES.get() + " started="
                    + STARTED.get() + " jni=" + JNI_CALLS.get());
            System.out.flush();
            Thread.sleep(100);
        }
    }
}
