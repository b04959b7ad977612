import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.List;

/**
 * Off-CPU workload with known answers: named threads that run, sleep, block on a monitor that
 * another thread holds most of the time, and block in a socket read answered after a delay.
 * Each thread measures its own wall time, CPU time (the JVM's) and run-queue delay (the
 * kernel's schedstat) over its whole run, and prints them at the end:
 * {@code result NAME TID WALL_NS CPU_NS RUNQUEUE_NS}; the time it spent blocked is
 * wall - CPU - run-queue delay.
 *
 * Args: seconds to run the threads (after "ready" and a pause for the profiler to find the JVM).
 */
public class OffCpu {
    static final Object LOCK = new Object();
    static final ThreadMXBean THREADS = ManagementFactory.getThreadMXBean();
    static volatile long sink;

    interface Body {
        void run(long until) throws Exception;
    }

    public static void main(String[] args) throws Exception {
        long seconds = args.length > 0 ? Long.parseLong(args[0]) : 20;
        System.out.println("ready");
        System.out.flush();
        Thread.sleep(3000);

        ServerSocket server = new ServerSocket(0, 1, InetAddress.getLoopbackAddress());
        Thread answerer = new Thread(() -> answer(server), "offcpu-answerer");
        answerer.setDaemon(true);
        answerer.start();
        Thread holder = new Thread(OffCpu::holdLock, "offcpu-holder");
        holder.setDaemon(true);
        holder.start();

        long until = System.nanoTime() + seconds * 1_000_000_000L;
        List<Thread> measured = new ArrayList<>();
        measured.add(measured("offcpu-spinner", OffCpu::spinLoop, until));
        measured.add(measured("offcpu-sleeper", OffCpu::sleepLoop, until));
        measured.add(measured("offcpu-blocked", OffCpu::blockedLoop, until));
        measured.add(measured("offcpu-reader", u -> readLoop(server.getLocalPort(), u), until));
        for (Thread thread : measured) {
            thread.join();
        }
        System.out.println("done");
        System.out.flush();
    }

    static Thread measured(String name, Body body, long until) {
        Thread thread = new Thread(() -> {
            try {
                String tid = Files.readSymbolicLink(Paths.get("/proc/thread-self"))
                        .getFileName().toString();
                long wall0 = System.nanoTime();
                long cpu0 = THREADS.getCurrentThreadCpuTime();
                long queue0 = runQueueDelay(tid);
                body.run(until);
                long wall = System.nanoTime() - wall0;
                long cpu = THREADS.getCurrentThreadCpuTime() - cpu0;
                long queue = runQueueDelay(tid) - queue0;
                synchronized (System.out) {
                    System.out.println("result " + Thread.currentThread().getName() + " " + tid
                            + " " + wall + " " + cpu + " " + queue);
                    System.out.flush();
                }
            } catch (Exception e) {
                e.printStackTrace();
            }
        }, name);
        thread.start();
        return thread;
    }

    /** The second field of /proc/thread-self/schedstat: time spent runnable, waiting for a CPU. */
    static long runQueueDelay(String tid) throws IOException {
        Path path = Paths.get("/proc/self/task/" + tid + "/schedstat");
        String[] fields = new String(Files.readAllBytes(path)).trim().split("\\s+");
        return Long.parseLong(fields[1]);
    }

    static void spinLoop(long until) {
        long x = 0;
        while (System.nanoTime() < until) {
            for (int i = 0; i < 100_000; i++) {
                x = x * 6364136223846793005L + i;
            }
        }
        sink = x;
    }

    static void sleepLoop(long until) throws InterruptedException {
        while (System.nanoTime() < until) {
            Thread.sleep(5);
        }
    }

    static void blockedLoop(long until) {
        while (System.nanoTime() < until) {
            synchronized (LOCK) {
                sink++;
            }
        }
    }

    /** Holds the monitor most of the time, so that blockedLoop waits for it. */
    static void holdLock() {
        while (true) {
            synchronized (LOCK) {
                try {
                    Thread.sleep(20);
                } catch (InterruptedException e) {
                    return;
                }
            }
            try {
                Thread.sleep(0, 100_000);
            } catch (InterruptedException e) {
                return;
            }
        }
    }

    static void readLoop(int port, long until) throws IOException {
        try (Socket socket = new Socket(InetAddress.getLoopbackAddress(), port)) {
            InputStream in = socket.getInputStream();
            OutputStream out = socket.getOutputStream();
            while (System.nanoTime() < until) {
                out.write(1);
                out.flush();
                if (in.read() < 0) {
                    return;
                }
            }
        }
    }

    /** Answers each byte after 10 ms. */
    static void answer(ServerSocket server) {
        try (Socket socket = server.accept()) {
            InputStream in = socket.getInputStream();
            OutputStream out = socket.getOutputStream();
            while (in.read() >= 0) {
                Thread.sleep(10);
                out.write(1);
                out.flush();
            }
        } catch (Exception e) {
            // The reader is done.
        }
    }
}
