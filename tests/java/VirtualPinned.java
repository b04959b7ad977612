import java.lang.reflect.Method;
import java.util.ArrayList;
import java.util.List;

/**
 * Virtual threads that wait while pinned to their carrier and allocate, 60 frames above their
 * entry: each round enters a monitor the others contend for and sleeps 2 ms inside it (on JDK 21
 * both the monitor wait and the sleep inside {@code synchronized} pin the carrier, which then
 * waits in the kernel with the virtual thread's frames on its stack, most of them frozen in the
 * chunk), then allocates 400 KB.
 *
 * Uses the virtual-thread API through reflection, so the class compiles for release 8.
 *
 * Args: seconds to run (after "ready" and a pause for the profiler to find the JVM).
 */
public class VirtualPinned {
    static final Object LOCK = new Object();
    static final int THREADS = 8;
    static final int DEPTH = 60;
    static byte[] kept;

    public static void main(String[] args) throws Exception {
        long seconds = args.length > 0 ? Long.parseLong(args[0]) : 20;
        System.out.println("ready");
        System.out.flush();
        Thread.sleep(2000);
        Object builder = Thread.class.getMethod("ofVirtual").invoke(null);
        Method start = Class.forName("java.lang.Thread$Builder").getMethod("start", Runnable.class);
        final long until = System.nanoTime() + seconds * 1_000_000_000L;
        List<Thread> threads = new ArrayList<>();
        for (int i = 0; i < THREADS; i++) {
            Runnable body = () -> descend(DEPTH, until);
            threads.add((Thread) start.invoke(builder, body));
        }
        for (Thread thread : threads) {
            thread.join();
        }
    }

    static void descend(int depth, long until) {
        if (depth > 0) {
            descend(depth - 1, until);
            return;
        }
        while (System.nanoTime() < until) {
            pinnedSite();
            allocSite();
        }
    }

    static void pinnedSite() {
        synchronized (LOCK) {
            try {
                Thread.sleep(2);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
    }

    static void allocSite() {
        for (int i = 0; i < 100; i++) {
            kept = new byte[4096];
        }
    }
}
