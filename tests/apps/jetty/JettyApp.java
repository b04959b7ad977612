import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.text.DecimalFormat;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.zip.CRC32;

import javax.servlet.http.HttpServlet;
import javax.servlet.http.HttpServletRequest;
import javax.servlet.http.HttpServletResponse;

import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.server.handler.gzip.GzipHandler;
import org.eclipse.jetty.servlet.DefaultServlet;
import org.eclipse.jetty.servlet.ServletContextHandler;
import org.eclipse.jetty.servlet.ServletHolder;
import org.eclipse.jetty.util.thread.QueuedThreadPool;

// An embedded Jetty 9.4 server (Debian's libjetty9-java) for the real-application corpus of
// tests/tests/real_apps/, loaded over HTTP by `ab`. What it serves exercises what web
// applications run: Jetty's HTTP parsing, dispatch and gzip; static files through Jetty's
// DefaultServlet; and two servlets doing typical request work (parameter parsing, regular
// expressions, hashing, collections, string formatting and concatenation, JSON-like output).
// Arguments: port, static directory. Prints "ready" once it accepts connections.
public class JettyApp {
    public static void main(String[] args) throws Exception {
        int port = Integer.parseInt(args[0]);
        Path staticDir = Path.of(args[1]);
        writeStaticFiles(staticDir);

        QueuedThreadPool pool = new QueuedThreadPool(16, 4);
        pool.setName("jetty-worker");
        Server server = new Server(pool);
        org.eclipse.jetty.server.ServerConnector connector =
                new org.eclipse.jetty.server.ServerConnector(server);
        connector.setHost("127.0.0.1");
        connector.setPort(port);
        server.addConnector(connector);

        ServletContextHandler context = new ServletContextHandler();
        context.setContextPath("/");
        context.setResourceBase(staticDir.toString());
        context.addServlet(new ServletHolder(new ReportServlet()), "/report");
        context.addServlet(new ServletHolder(new SearchServlet()), "/search");
        ServletHolder files = new ServletHolder("static", new DefaultServlet());
        files.setInitParameter("dirAllowed", "false");
        files.setInitParameter("etags", "true");
        context.addServlet(files, "/");

        GzipHandler gzip = new GzipHandler();
        gzip.setMinGzipSize(256);
        gzip.setHandler(context);
        server.setHandler(gzip);
        server.start();
        System.out.println("ready");
        System.out.flush();
        server.join();
    }

    static void writeStaticFiles(Path dir) throws IOException {
        Files.createDirectories(dir);
        StringBuilder page = new StringBuilder("<html><body><table>\n");
        for (int i = 0; i < 2000; i++) {
            page.append("<tr><td>row ").append(i).append("</td><td>")
                    .append(Integer.toHexString(i * 2654435761L > 0 ? i * 31 : i))
                    .append("</td><td>lorem ipsum dolor sit amet</td></tr>\n");
        }
        page.append("</table></body></html>\n");
        Files.write(dir.resolve("table.html"), page.toString().getBytes(StandardCharsets.UTF_8));
    }

    // Orders aggregated per region and product, rendered as JSON: maps, sorting, formatting.
    static final class ReportServlet extends HttpServlet {
        private static final String[] REGIONS = {"north", "south", "east", "west", "centre"};
        private static final DecimalFormat MONEY = new DecimalFormat("0.00");

        @Override
        protected void doGet(HttpServletRequest request, HttpServletResponse response)
                throws IOException {
            int orders = parse(request.getParameter("orders"), 2000);
            long seed = parse(request.getParameter("seed"), 7);
            Map<String, Map<String, double[]>> totals = new TreeMap<>();
            for (int i = 0; i < orders; i++) {
                seed = seed * 6364136223846793005L + 1442695040888963407L;
                String region = REGIONS[(int) ((seed >>> 33) % REGIONS.length)];
                String product = "product-" + ((seed >>> 40) % 53);
                double amount = ((seed >>> 20) & 0xffff) / 100.0;
                double[] cell = totals.computeIfAbsent(region, r -> new HashMap<>())
                        .computeIfAbsent(product, p -> new double[2]);
                cell[0] += amount;
                cell[1] += 1;
            }
            StringBuilder json = new StringBuilder("{");
            synchronized (MONEY) {
                render(totals, json);
            }
            json.setCharAt(json.length() - 1, '}');
            response.setContentType("application/json");
            response.setCharacterEncoding("UTF-8");
            response.getWriter().write(json.toString());
        }

        // Renders with the servlet's one DecimalFormat, which is not thread-safe: callers hold
        // its lock, as legacy code sharing a formatter does, so concurrent reports wait for
        // each other here (the monitor contention the lock profiles are compared on).
        private static void render(Map<String, Map<String, double[]>> totals, StringBuilder json) {
            for (Map.Entry<String, Map<String, double[]>> region : totals.entrySet()) {
                List<Map.Entry<String, double[]>> rows = new ArrayList<>(region.getValue().entrySet());
                rows.sort((a, b) -> Double.compare(b.getValue()[0], a.getValue()[0]));
                json.append('"').append(region.getKey()).append("\":[");
                for (Map.Entry<String, double[]> row : rows) {
                    json.append(String.format("{\"product\":\"%s\",\"total\":%s,\"mean\":%.3f},",
                            row.getKey(), MONEY.format(row.getValue()[0]),
                            row.getValue()[0] / row.getValue()[1]));
                }
                json.setCharAt(json.length() - 1, ']');
                json.append(',');
            }
        }
    }

    // A text search over generated documents: regular expressions, hashing, checksums, sorting.
    static final class SearchServlet extends HttpServlet {
        private static final List<String> DOCUMENTS = new ArrayList<>();

        static {
            String[] words = {"alpha", "beta", "gamma", "delta", "jetty", "servlet", "request",
                "profile", "stack", "frame", "thread", "queue", "buffer", "socket"};
            long seed = 42;
            for (int d = 0; d < 400; d++) {
                StringBuilder doc = new StringBuilder();
                for (int w = 0; w < 60; w++) {
                    seed = seed * 6364136223846793005L + 1442695040888963407L;
                    doc.append(words[(int) ((seed >>> 33) % words.length)]).append(' ');
                    if (w % 9 == 0) {
                        doc.append(seed >>> 50).append(", ");
                    }
                }
                DOCUMENTS.add(doc.toString());
            }
        }

        @Override
        protected void doGet(HttpServletRequest request, HttpServletResponse response)
                throws IOException {
            String query = request.getParameter("q");
            Pattern pattern = Pattern.compile("\\b(" + (query == null ? "stack" : query)
                    + ")\\s+(\\w+)\\b", Pattern.CASE_INSENSITIVE);
            Map<String, Integer> followers = new HashMap<>();
            CRC32 crc = new CRC32();
            MessageDigest sha;
            try {
                sha = MessageDigest.getInstance("SHA-256");
            } catch (NoSuchAlgorithmException e) {
                throw new IOException(e);
            }
            int limit = parse(request.getParameter("docs"), DOCUMENTS.size());
            for (int d = 0; d < Math.min(limit, DOCUMENTS.size()); d++) {
                String doc = DOCUMENTS.get(d);
                Matcher matcher = pattern.matcher(doc);
                while (matcher.find()) {
                    followers.merge(matcher.group(2).toLowerCase(), 1, Integer::sum);
                }
                byte[] bytes = doc.getBytes(StandardCharsets.UTF_8);
                crc.update(bytes);
                sha.update(bytes);
            }
            List<Map.Entry<String, Integer>> ranked = new ArrayList<>(followers.entrySet());
            Collections.sort(ranked, Map.Entry.<String, Integer>comparingByValue().reversed());
            StringBuilder out = new StringBuilder();
            out.append("crc=").append(Long.toHexString(crc.getValue()))
                    .append(" sha=").append(hex(sha.digest())).append('\n');
            for (Map.Entry<String, Integer> entry : ranked) {
                out.append(entry.getKey() + " " + entry.getValue() + "\n");
            }
            response.setContentType("text/plain");
            response.getWriter().write(out.toString());
        }
    }

    static String hex(byte[] bytes) {
        StringBuilder s = new StringBuilder();
        for (byte b : bytes) {
            s.append(String.format("%02x", b));
        }
        return s.toString();
    }

    static int parse(String value, int fallback) {
        if (value == null) {
            return fallback;
        }
        try {
            return Integer.parseInt(value);
        } catch (NumberFormatException e) {
            return fallback;
        }
    }
}
