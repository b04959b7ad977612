import java.lang.management.ManagementFactory;
import java.time.Instant;
import java.util.concurrent.locks.LockSupport;

// Allocations with a known split, one site per named thread, each paced to a fixed byte rate:
//   alloc-seventy  siteSeventy: instances of AllocSplit$Seventy (three longs), 56 MB/s (70%);
//   alloc-thirty   siteThirty: long[16], 24 MB/s (30%);
//   alloc-large    siteLarge: byte[8 MiB], larger than any TLAB (so allocated outside one),
//                  8 per second.
// Every object escapes through a static volatile field, so the JIT cannot eliminate it; the
// live set is a few objects (the large array is dropped at once).
//
// The truth: each thread measures its own allocated bytes (the JVM's per-thread counter) after
// every batch, a few milliseconds of its allocation; the main thread prints them, cumulative
// since the threads started, with the wall clock (nanoseconds since the epoch), every 100 ms:
//   ALLOC <epoch ns> seventy=<bytes> thirty=<bytes> large=<bytes> arrays=<8 MiB arrays>
// Prints "ready" first, once every thread runs.
public class AllocSplit {
    static final com.sun.management.ThreadMXBean THREADS =
            (com.sun.management.ThreadMXBean) ManagementFactory.getThreadMXBean();
    static final int LARGE_BYTES = 8 << 20;

    static final class Seventy {
        final long a, b, c;

        Seventy(long a, long b, long c) {
            this.a = a;
            this.b = b;
            this.c = c;
        }
    }

    static volatile Seventy lastSeventy;
    static volatile long[] lastThirty;
    static volatile byte[] lastLarge;

    static void siteSeventy(long i) {
        lastSeventy = new Seventy(i, i + 1, i + 2);
    }

    static void siteThirty(long i) {
        long[] array = new long[16];
        array[0] = i;
        lastThirty = array;
    }

    static void siteLarge() {
        lastLarge = new byte[LARGE_BYTES];
        lastLarge = null;
    }

    /** One site's thread: batches of its allocations, paced to its rate, measured after each. */
    static final class Site implements Runnable {
        final String name;
        final double bytesPerSecond;
        volatile long allocated;
        volatile long arrays;

        Site(String name, double bytesPerSecond) {
            this.name = name;
            this.bytesPerSecond = bytesPerSecond;
        }

        Thread start() {
            Thread thread = new Thread(this, "alloc-" + name);
            thread.setDaemon(true);
            thread.start();
            return thread;
        }

        public void run() {
            long id = Thread.currentThread().getId();
            long base = THREADS.getThreadAllocatedBytes(id);
            long started = System.nanoTime();
            long i = 0;
            while (true) {
                i = batch(i);
                long bytes = THREADS.getThreadAllocatedBytes(id) - base;
                allocated = bytes;
                long due = started + (long) (bytes * 1e9 / bytesPerSecond);
                long early = due - System.nanoTime();
                if (early > 0) {
                    LockSupport.parkNanos(early);
                }
            }
        }

        /** About 160 KB of small objects, or one large array. */
        long batch(long i) {
            switch (name) {
                case "seventy":
                    for (int n = 0; n < 4096; n++) {
                        siteSeventy(i++);
                    }
                    return i;
                case "thirty":
                    for (int n = 0; n < 1024; n++) {
                        siteThirty(i++);
                    }
                    return i;
                default:
                    siteLarge();
                    arrays++;
                    return i + 1;
            }
        }
    }

    public static void main(String[] args) throws Exception {
        Site seventy = new Site("seventy", 56e6);
        Site thirty = new Site("thirty", 24e6);
        Site large = new Site("large", 8.0 * (LARGE_BYTES + 16));
        for (Site site : new Site[] {seventy, thirty, large}) {
            site.start();
        }
        System.out.println("ready");
        System.out.flush();
        while (true) {
            Instant now = Instant.now();
            long nanos = now.getEpochSecond() * 1_000_000_000L + now.getNano();
            System.out.println("ALLOC " + nanos + " seventy=" + seventy.allocated + " thirty="
                    + thirty.allocated + " large=" + large.allocated + " arrays=" + large.arrays);
            System.out.flush();
            Thread.sleep(100);
        }
    }
}
