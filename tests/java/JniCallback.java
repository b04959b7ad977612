// Java -> a JNI library built without frame pointers -> back into Java, in a loop: the library's
// own frames must appear between the Java frames above and below them. The library's path comes
// in the `jni.lib` property (tests/workloads/jni_callback.c).
public class JniCallback {
    static {
        System.load(System.getProperty("jni.lib"));
    }

    static volatile long sink;

    /** Spins in the library's frameless leaf, and calls `javaCallback` from it, `rounds` times. */
    static native long nativeOuter(int rounds);

    static long javaCallback(int n) {
        long sum = 0;
        for (int i = 0; i < n; i++) {
            sum += (i * 31L) ^ sum;
        }
        return sum;
    }

    static void javaCaller() {
        while (true) {
            sink += nativeOuter(100);
        }
    }

    public static void main(String[] args) {
        System.out.println("ready");
        javaCaller();
    }
}
