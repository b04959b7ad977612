// Time spent in C1's runtime stubs, which record no frame layout their walk could use. Run with
// -XX:TieredStopAtLevel=3 (C1 with profiling, C2 never) so that:
//   type-worker     checks objects against interfaces that are not their primary supers: each
//                   instanceof calls C1's `slow_subtype_check` stub (it pushes four registers
//                   and builds no frame) from typeCheck;
//   counter-worker  calls a small method in a loop: its profiled code calls C1's
//                   `counter_overflow` stub (an rbp frame saving every register) each time an
//                   invocation or loop counter overflows.
// Prints "ready" once both threads run.
public class C1Stubs {
    interface I0 {}
    interface I1 {}
    interface I2 {}
    interface I3 {}
    interface I4 {}
    interface I5 {}
    interface I6 {}
    interface I7 {}
    interface I8 {}
    interface I9 {}

    // Ten secondary supers each, in opposite orders: the one-element cache of the last super
    // found misses on every other check.
    static final class Forward implements I0, I1, I2, I3, I4, I5, I6, I7, I8, I9 {}

    static final class Backward implements I9, I8, I7, I6, I5, I4, I3, I2, I1, I0 {}

    static volatile long sink;

    static long typeCheck(Object o) {
        long n = 0;
        if (o instanceof I9) n++;
        if (o instanceof I0) n++;
        if (o instanceof I5) n++;
        if (o instanceof I7) n++;
        return n;
    }

    static long typeLoop() {
        Object[] objects = {new Forward(), new Backward(), "text", Integer.valueOf(3)};
        long s = 0;
        for (int i = 0; ; i++) {
            s += typeCheck(objects[i & 3]);
            if ((i & 0xffff) == 0) sink = s;
        }
    }

    static long step(long x) {
        return x * 31 + 7;
    }

    static void counterLoop() {
        long s = 0;
        while (true) {
            for (int i = 0; i < 1000; i++) s += step(i);
            sink = s;
        }
    }

    public static void main(String[] args) throws Exception {
        Thread types = new Thread(C1Stubs::typeLoop, "type-worker");
        Thread counters = new Thread(C1Stubs::counterLoop, "counter-worker");
        types.start();
        counters.start();
        Thread.sleep(200);
        System.out.println("ready");
        types.join();
    }
}
