import java.util.concurrent.atomic.LongAdder;

// The thread-start workload of `cargo xtask bench` (section 9). Prints "ready" first.
//
//   ThreadChurn STARTERS
//       STARTERS threads each start a Java thread that does next to nothing, join it, and start
//       the next: the rate is bounded by what starting and ending a thread costs, which the
//       daemon's thread-start hook (a uprobe on `JavaThread::run`, and the map entry it makes and
//       the exit tracepoint removes) adds to. Prints "ops STARTS NANOS" every 100 ms: the threads
//       started and ended so far and System.nanoTime, taken together so that a rate between two
//       reports is exact.
public class ThreadChurn {
    static volatile long sink;

    public static void main(String[] args) throws Exception {
        int starters = Integer.parseInt(args[0]);
        LongAdder starts = new LongAdder();
        for (int s = 0; s < starters; s++) {
            Thread starter = new Thread(() -> churn(starts), "starter-" + s);
            starter.setDaemon(true);
            starter.start();
        }
        System.out.println("ready");
        System.out.flush();
        while (true) {
            Thread.sleep(100);
            long count = starts.sum();
            long now = System.nanoTime();
            System.out.println("ops " + count + " " + now);
            System.out.flush();
        }
    }

    static void churn(LongAdder starts) {
        long n = 0;
        while (true) {
            final long seed = n++;
            Thread thread = new Thread(() -> sink = seed * 31, "short");
            thread.start();
            try {
                thread.join();
            } catch (InterruptedException e) {
                return;
            }
            starts.increment();
        }
    }
}
