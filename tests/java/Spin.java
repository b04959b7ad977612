// A JVM that stays busy until killed: a hot loop the JIT compiles, on a named thread
// (`spin-worker`, or the system property `spin.thread`).
public class Spin {
    static volatile long sink;

    static long work(long n) {
        long acc = 0;
        for (long i = 0; i < n; i++) {
            acc += i * 31 + (acc >>> 7);
        }
        return acc;
    }

    public static void main(String[] args) throws Exception {
        Thread worker = new Thread(() -> {
            while (true) {
                sink += work(1_000_000);
            }
        }, System.getProperty("spin.thread", "spin-worker"));
        worker.setDaemon(true);
        worker.start();
        System.out.println("ready");
        System.out.flush();
        worker.join();
    }
}
