import java.util.concurrent.atomic.LongAdder;
import java.util.concurrent.locks.ReentrantLock;

// The lock-heavy workload of `cargo xtask bench` (section 9). Prints "ready" first.
//
//   Contention THREADS HOLD_WORK
//       THREADS workers take turns on one monitor (`synchronized`) and one ReentrantLock (which
//       parks its waiters), alternately: each turn hashes HOLD_WORK rounds while holding the
//       lock and as many outside it, so that with more workers than CPUs every turn has
//       waiters, most of whom block (and then switch, which is what lock profiling sees), some
//       for longer than the daemon's 10 ms threshold. Prints "ops TURNS NANOS" every 100 ms: the
//       turns taken so far and System.nanoTime, taken together so that a rate between two
//       reports is exact.
public class Contention {
    static final Object MONITOR = new Object();
    static final ReentrantLock LOCK = new ReentrantLock();
    static volatile long sink;

    public static void main(String[] args) throws Exception {
        int threads = Integer.parseInt(args[0]);
        int work = Integer.parseInt(args[1]);
        LongAdder turns = new LongAdder();
        for (int t = 0; t < threads; t++) {
            long seed = 0x9E3779B97F4A7C15L * (t + 1);
            Thread thread = new Thread(() -> contend(seed, work, turns), "contend-" + t);
            thread.setDaemon(true);
            thread.start();
        }
        System.out.println("ready");
        System.out.flush();
        while (true) {
            Thread.sleep(100);
            long count = turns.sum();
            long now = System.nanoTime();
            System.out.println("ops " + count + " " + now);
            System.out.flush();
        }
    }

    static void contend(long seed, int work, LongAdder turns) {
        long s = seed;
        while (true) {
            s = hash(s, work);
            synchronized (MONITOR) {
                s = hash(s, work);
            }
            turns.increment();
            s = hash(s, work);
            LOCK.lock();
            try {
                s = hash(s, work);
            } finally {
                LOCK.unlock();
            }
            turns.increment();
            if (s == 0) {
                sink = s;
            }
        }
    }

    static long hash(long s, int work) {
        long h = s;
        for (int k = 0; k < work; k++) {
            h ^= h << 13;
            h ^= h >>> 7;
            h ^= h << 17;
        }
        return h;
    }
}
