import java.lang.reflect.Method;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.locks.LockSupport;

/**
 * Virtual threads whose hot methods run far above their entry: each thread recurses
 * {@code DEPTH} frames deep, then loops doing CPU work and parking for a millisecond, so that
 * it unmounts and is continued with most of its frames still frozen in its stack chunk. Two
 * families of threads take two disjoint paths ({@code alphaStep}/{@code alphaWork} and
 * {@code betaStep}/{@code betaWork}): a sample whose frames mix the two named frames of
 * another virtual thread. Work is split 70:30 between the alpha and beta threads by their
 * count, and every thread counts its own rounds of work, written at the end to the results
 * file as {@code rounds alpha N beta M}.
 *
 * Uses the virtual-thread API through reflection, so the class compiles for release 8 and
 * runs on JDK 21 and later.
 *
 * Args: seconds to run (after "ready" and a pause for the profiler to find the JVM), depth,
 * the results file, and {@code platform} to run the same work on platform threads instead (to
 * compare what walking either costs).
 */
public class VirtualDeep {
    static final int THREADS = 40;
    static final int ALPHA_THREADS = 28;
    static volatile long sink;
    static final long[] rounds = new long[THREADS];

    public static void main(String[] args) throws Exception {
        long seconds = args.length > 0 ? Long.parseLong(args[0]) : 20;
        final int depth = args.length > 1 ? Integer.parseInt(args[1]) : 120;
        String results = args.length > 2 ? args[2] : null;
        boolean platform = args.length > 3 && args[3].equals("platform");
        System.out.println("ready");
        System.out.flush();
        Thread.sleep(2000);

        Object builder = Thread.class.getMethod("ofVirtual").invoke(null);
        Method start = Class.forName("java.lang.Thread$Builder").getMethod("start", Runnable.class);
        final long until = System.nanoTime() + seconds * 1_000_000_000L;
        List<Thread> threads = new ArrayList<>();
        for (int i = 0; i < THREADS; i++) {
            final int index = i;
            Runnable body = index < ALPHA_THREADS
                    ? () -> alphaStep(depth, index, until)
                    : () -> betaStep(depth, index, until);
            if (platform) {
                Thread thread = new Thread(body, "platform-" + index);
                thread.start();
                threads.add(thread);
            } else {
                threads.add((Thread) start.invoke(builder, body));
            }
        }
        for (Thread thread : threads) {
            thread.join();
        }
        long alpha = 0;
        long beta = 0;
        for (int i = 0; i < THREADS; i++) {
            if (i < ALPHA_THREADS) {
                alpha += rounds[i];
            } else {
                beta += rounds[i];
            }
        }
        String line = "rounds alpha " + alpha + " beta " + beta;
        if (results != null) {
            java.nio.file.Files.write(java.nio.file.Paths.get(results), (line + "\n").getBytes("UTF-8"));
        } else {
            System.out.println(line);
        }
    }

    static void alphaStep(int depth, int index, long until) {
        if (depth > 0) {
            alphaStep(depth - 1, index, until);
            return;
        }
        while (System.nanoTime() < until) {
            alphaWork();
            rounds[index]++;
            LockSupport.parkNanos(1_000_000);
        }
    }

    static void betaStep(int depth, int index, long until) {
        if (depth > 0) {
            betaStep(depth - 1, index, until);
            return;
        }
        while (System.nanoTime() < until) {
            betaWork();
            rounds[index]++;
            LockSupport.parkNanos(1_000_000);
        }
    }

    static void alphaWork() {
        long x = sink;
        for (int i = 0; i < 200_000; i++) {
            x = x * 6364136223846793005L + 1442695040888963407L;
        }
        sink = x;
    }

    static void betaWork() {
        long x = sink;
        for (int i = 0; i < 200_000; i++) {
            x = x * 6364136223846793005L + 1442695040888963407L;
        }
        sink = x;
    }
}
