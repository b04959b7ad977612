import java.io.BufferedWriter;
import java.io.OutputStreamWriter;
import java.io.PrintWriter;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.time.Instant;

import jdk.jfr.consumer.RecordedEvent;
import jdk.jfr.consumer.RecordedFrame;
import jdk.jfr.consumer.RecordedMethod;
import jdk.jfr.consumer.RecordedStackTrace;
import jdk.jfr.consumer.RecordedThread;
import jdk.jfr.consumer.RecordingFile;

// Prints every jdk.ExecutionSample of a JFR recording, one line each, with the JDK's own
// parser (what `jfr print` uses): what tests/tests/real_apps.rs compares the daemon with.
// `jfr print --json` writes each frame's class loader and module in full (kilobytes per frame),
// too much for thousands of deep stacks; this keeps what the comparison needs.
//
// Line: <epoch nanos> TAB <truncated 0|1> TAB <thread name> {TAB <frame type> | <class.method>}
// frames innermost first; frame type as JFR names it ("JIT compiled", "Inlined", ...).
public class JfrSamples {
    public static void main(String[] args) throws Exception {
        PrintWriter out = new PrintWriter(new BufferedWriter(
                new OutputStreamWriter(System.out, StandardCharsets.UTF_8), 1 << 16));
        try (RecordingFile file = new RecordingFile(Path.of(args[0]))) {
            while (file.hasMoreEvents()) {
                RecordedEvent event = file.readEvent();
                if (!event.getEventType().getName().equals("jdk.ExecutionSample")) {
                    continue;
                }
                Instant start = event.getStartTime();
                RecordedThread thread = event.getThread("sampledThread");
                RecordedStackTrace stack = event.getStackTrace();
                StringBuilder line = new StringBuilder();
                line.append(start.getEpochSecond() * 1_000_000_000L + start.getNano()).append('\t');
                line.append(stack != null && stack.isTruncated() ? '1' : '0').append('\t');
                line.append(clean(thread == null ? "" : thread.getJavaName()));
                if (stack != null) {
                    for (RecordedFrame frame : stack.getFrames()) {
                        RecordedMethod method = frame.getMethod();
                        line.append('\t').append(frame.getType()).append('|');
                        if (method == null) {
                            line.append("[no method]");
                        } else {
                            line.append(clean(method.getType().getName())).append('.')
                                    .append(clean(method.getName()));
                        }
                    }
                }
                out.println(line);
            }
        }
        out.flush();
    }

    static String clean(String s) {
        return s == null ? "" : s.replace('\t', ' ').replace('\n', ' ').replace('|', '/');
    }
}
