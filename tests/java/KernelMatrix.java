// The kernel matrix's Java workloads in one JVM (tests/tests/kernel_matrix.rs): on the guest's
// emulated CPUs every JVM costs the daemon seconds to inspect, and three took longer than the run.
// Workloads' split-worker (CPU), LockSplit (monitor, park and sleep waits) and AllocSplit
// (allocation sites), each started by its own main on a thread of its own; each prints "ready".
// An argument names a file to wait for first: the guest starts the JVM, then the daemons, whose
// programs the emulated kernel verifies faster with no workload spinning beside them.
public class KernelMatrix {
    interface Main {
        void run() throws Exception;
    }

    static void start(String name, Main main) {
        Thread thread = new Thread(() -> {
            try {
                main.run();
            } catch (Exception e) {
                throw new RuntimeException(e);
            }
        }, name);
        thread.setDaemon(true);
        thread.start();
    }

    public static void main(String[] args) throws Exception {
        if (args.length > 0) {
            java.io.File go = new java.io.File(args[0]);
            while (!go.exists()) {
                Thread.sleep(100);
            }
        }
        start("workloads-main", () -> Workloads.main(new String[] {"split-worker"}));
        start("lock-main", () -> LockSplit.main(new String[0]));
        start("alloc-main", () -> AllocSplit.main(new String[0]));
        Thread.sleep(Long.MAX_VALUE);
    }
}
