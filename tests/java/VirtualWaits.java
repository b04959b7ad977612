import java.io.PrintWriter;
import java.lang.reflect.Method;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.ReentrantLock;

/**
 * Virtual threads that wait unmounted, 40 frames above their entry: each round sleeps 3 ms
 * ({@code sleepSite}), takes a {@code ReentrantLock} the others contend for and holds it for
 * 0.3 ms ({@code lockSite}), and enters a contended monitor held as long ({@code monitorSite}:
 * JDK 24+ unmount to wait for it; JDK 21 pins the carrier). Each site's wait time is measured
 * here (from the call to the lock taken, or the sleep's end) and written at the end, one
 * "site nanoseconds" line each.
 *
 * With "per-task", each round runs on a virtual thread of its own, started for it and joined
 * (as a server starts one per request): every wait is then in a virtual thread's first rounds.
 *
 * Uses the virtual-thread API through reflection, so the class compiles for release 8.
 *
 * Args: seconds to run (after "ready" and a pause for the profiler to find the JVM), results
 * file, and optionally "per-task".
 */
public class VirtualWaits {
    static final ReentrantLock LOCK = new ReentrantLock();
    static final Object MONITOR = new Object();
    static final int THREADS = 24;
    static final int DEPTH = 40;
    static final AtomicLong SLEPT = new AtomicLong();
    static final AtomicLong LOCK_WAITED = new AtomicLong();
    static final AtomicLong MONITOR_WAITED = new AtomicLong();
    static volatile long sink;
    static Object builder;
    static Method start;
    static boolean perTask;

    public static void main(String[] args) throws Exception {
        long seconds = args.length > 0 ? Long.parseLong(args[0]) : 20;
        String results = args.length > 1 ? args[1] : null;
        perTask = args.length > 2 && args[2].equals("per-task");
        System.out.println("ready");
        System.out.flush();
        Thread.sleep(2000);
        builder = Thread.class.getMethod("ofVirtual").invoke(null);
        start = Class.forName("java.lang.Thread$Builder").getMethod("start", Runnable.class);
        final long until = System.nanoTime() + seconds * 1_000_000_000L;
        List<Thread> threads = new ArrayList<>();
        for (int i = 0; i < THREADS; i++) {
            Runnable body = () -> descend(DEPTH, until);
            threads.add((Thread) start.invoke(builder, body));
        }
        for (Thread thread : threads) {
            thread.join();
        }
        if (results != null) {
            try (PrintWriter out = new PrintWriter(results)) {
                out.println("sleepSite " + SLEPT.get());
                out.println("lockSite " + LOCK_WAITED.get());
                out.println("monitorSite " + MONITOR_WAITED.get());
            }
        }
    }

    /** {@link #descend}'s deadline for one round only. */
    static final long ONCE = Long.MIN_VALUE;

    static void descend(int depth, long until) {
        if (depth > 0) {
            descend(depth - 1, until);
            return;
        }
        if (until == ONCE) {
            round();
            return;
        }
        while (System.nanoTime() < until) {
            if (perTask) {
                try {
                    Runnable task = () -> descend(DEPTH, ONCE);
                    ((Thread) start.invoke(builder, task)).join();
                } catch (Exception e) {
                    throw new RuntimeException(e);
                }
                continue;
            }
            round();
        }
    }

    static void round() {
        sleepSite();
        lockSite();
        monitorSite();
    }

    static void sleepSite() {
        long start = System.nanoTime();
        try {
            Thread.sleep(3);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        SLEPT.addAndGet(System.nanoTime() - start);
    }

    static void lockSite() {
        long start = System.nanoTime();
        LOCK.lock();
        try {
            LOCK_WAITED.addAndGet(System.nanoTime() - start);
            spin(300_000);
        } finally {
            LOCK.unlock();
        }
    }

    static void monitorSite() {
        long start = System.nanoTime();
        synchronized (MONITOR) {
            MONITOR_WAITED.addAndGet(System.nanoTime() - start);
            spin(300_000);
        }
    }

    static void spin(long nanos) {
        long end = System.nanoTime() + nanos;
        long x = 0;
        while (System.nanoTime() < end) {
            x += x * 31 + 7;
        }
        sink = x;
    }
}
