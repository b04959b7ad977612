import java.time.Instant;
import java.util.concurrent.locks.ReentrantLock;

// Lock waits with known totals, per site, each waiting thread measuring its own waits:
//   lock-monitor-1..3  monitorSite: enter `synchronized (MONITOR)`, hold it HOLD_MS;
//   lock-park-1..3     parkSite: a fair ReentrantLock (its waiters park in Unsafe.park), same;
//   lock-sleeper       sleepSite: Thread.sleep(30), no lock: in neither lock profile;
//   lock-waiter        waitSite: Object.wait(30) on its own object, no contention: in neither.
//
// The holders sleep while holding, so the workload uses next to no CPU, and the waits are long
// (10 to 50 ms) and regular. After releasing, a thread pauses PAUSE_MS (outside the site) before
// it comes back: so it arrives in the middle of the next holder's HOLD_MS, never at a release,
// and every entry waits. A release wakes one waiter, which takes the lock before anyone else
// arrives: one contended entry is one park, one wait in the daemon's profile. The lock is fair
// for the same reason: should a thread arrive while the woken waiter is still on its way to the
// CPU (a crowded machine), it queues behind it instead of barging in, which would send the woken
// one back to park a second time for the same entry (a second wait in the profile, a single one
// in the counts here). The monitor has no such option (HotSpot lets a newcomer take a just
// released monitor), hence the pause.
//
// The truth: for every entry, the time from just before `synchronized` / `lock()` to just
// inside, measured with System.nanoTime() by the entering thread, which adds it to its own
// totals at once (before holding), when over EPSILON_NS (1 ms): shorter waits are not counted,
// as the test's `--lock=1ms` leaves them out. The main thread prints the site totals, cumulative
// since the threads started, with the wall clock (nanoseconds since the epoch), every 100 ms:
//   LOCK <epoch ns> monitor_ns=<ns waited> monitor_waits=<waits> park_ns=<ns> park_waits=<waits>
// Prints "ready" first, once every thread runs.
public class LockSplit {
    static final long HOLD_MS = 20;
    static final long PAUSE_MS = 10;
    static final long EPSILON_NS = 1_000_000;
    static final int THREADS_PER_SITE = 3;

    static final Object MONITOR = new Object();
    static final ReentrantLock LOCK = new ReentrantLock(true);

    /** One thread's waits: written by that thread alone, read by the main thread. */
    static final class Waits {
        volatile long nanos;
        volatile long count;

        void add(long waited) {
            if (waited > EPSILON_NS) {
                nanos += waited;
                count++;
            }
        }
    }

    static void monitorSite(Waits waits) throws InterruptedException {
        long before = System.nanoTime();
        synchronized (MONITOR) {
            waits.add(System.nanoTime() - before);
            Thread.sleep(HOLD_MS);
        }
    }

    static void parkSite(Waits waits) throws InterruptedException {
        long before = System.nanoTime();
        LOCK.lock();
        try {
            waits.add(System.nanoTime() - before);
            Thread.sleep(HOLD_MS);
        } finally {
            LOCK.unlock();
        }
    }

    static void sleepSite() throws InterruptedException {
        Thread.sleep(30);
    }

    static void waitSite(Object own) throws InterruptedException {
        synchronized (own) {
            own.wait(30);
        }
    }

    interface Step {
        void run() throws InterruptedException;
    }

    static void start(String name, Step step) {
        Thread thread = new Thread(() -> {
            try {
                while (true) {
                    step.run();
                }
            } catch (InterruptedException e) {
                // Never interrupted: the JVM is killed.
            }
        }, name);
        thread.setDaemon(true);
        thread.start();
    }

    static Waits[] site(String name, boolean monitor) {
        Waits[] all = new Waits[THREADS_PER_SITE];
        for (int i = 0; i < all.length; i++) {
            Waits waits = new Waits();
            all[i] = waits;
            start("lock-" + name + "-" + (i + 1), () -> {
                if (monitor) {
                    monitorSite(waits);
                } else {
                    parkSite(waits);
                }
                Thread.sleep(PAUSE_MS);
            });
        }
        return all;
    }

    static String totals(String name, Waits[] site) {
        long nanos = 0;
        long count = 0;
        for (Waits waits : site) {
            nanos += waits.nanos;
            count += waits.count;
        }
        return " " + name + "_ns=" + nanos + " " + name + "_waits=" + count;
    }

    public static void main(String[] args) throws Exception {
        Waits[] monitor = site("monitor", true);
        Waits[] park = site("park", false);
        start("lock-sleeper", LockSplit::sleepSite);
        Object own = new Object();
        start("lock-waiter", () -> waitSite(own));
        System.out.println("ready");
        System.out.flush();
        while (true) {
            Instant now = Instant.now();
            long nanos = now.getEpochSecond() * 1_000_000_000L + now.getNano();
            System.out.println("LOCK " + nanos + totals("monitor", monitor) + totals("park", park));
            System.out.flush();
            Thread.sleep(100);
        }
    }
}
