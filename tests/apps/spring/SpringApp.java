import java.io.File;
import java.math.BigDecimal;
import java.math.RoundingMode;
import java.time.LocalDate;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.stream.Collectors;

import org.apache.catalina.Context;
import org.apache.catalina.startup.Tomcat;
import org.springframework.http.converter.json.MappingJackson2HttpMessageConverter;
import org.springframework.web.bind.annotation.PathVariable;
import org.springframework.web.bind.annotation.RequestBody;
import org.springframework.web.bind.annotation.RequestMapping;
import org.springframework.web.bind.annotation.RequestMethod;
import org.springframework.web.bind.annotation.RequestParam;
import org.springframework.web.bind.annotation.RestController;
import org.springframework.web.context.support.AnnotationConfigWebApplicationContext;
import org.springframework.web.servlet.DispatcherServlet;
import org.springframework.web.servlet.mvc.method.annotation.RequestMappingHandlerAdapter;
import org.springframework.web.servlet.mvc.method.annotation.RequestMappingHandlerMapping;

// Spring Web MVC 4.3 on an embedded Tomcat 9 (Debian's libspring-web-servlet-java and
// libtomcat9-java) for the real-application corpus of tests/tests/real_apps/, loaded over HTTP
// by `ab`. A request runs the deep, mostly distinct framework stack such services have: Tomcat's
// connector, filter chain and servlet, Spring's dispatcher, handler mapping, argument resolvers
// and message converters, Jackson reading and writing JSON, then a controller doing ordinary
// work (streams, BigDecimal arithmetic, dates, maps). Arguments: port, base directory, and
// "virtual" to run each request on a virtual thread of its own (JDK 21+: the connector's
// executor is `Executors.newVirtualThreadPerTaskExecutor()`, as Spring Boot's
// `spring.threads.virtual.enabled` makes it). Prints "ready" once it accepts connections.
public class SpringApp {
    public static void main(String[] args) throws Exception {
        int port = Integer.parseInt(args[0]);
        File base = new File(args[1]);
        base.mkdirs();

        AnnotationConfigWebApplicationContext spring = new AnnotationConfigWebApplicationContext();
        // Beans registered whole: `@Configuration` classes and `@EnableWebMvc` need CGLIB
        // proxies, whose ASM in Spring 4.3 cannot read the JDK 17 class files it subclasses.
        spring.register(OrderController.class, JsonHandlerAdapter.class,
                RequestMappingHandlerMapping.class);

        Tomcat tomcat = new Tomcat();
        tomcat.setBaseDir(base.getAbsolutePath());
        tomcat.setHostname("127.0.0.1");
        tomcat.setPort(port);
        tomcat.getConnector().setProperty("address", "127.0.0.1");
        tomcat.getConnector().setProperty("maxThreads", "16");
        if (args.length > 2 && args[2].equals("virtual")) {
            // Through reflection: the class compiles for JDK 17.
            Object executor = java.util.concurrent.Executors.class
                    .getMethod("newVirtualThreadPerTaskExecutor").invoke(null);
            tomcat.getConnector().getProtocolHandler()
                    .setExecutor((java.util.concurrent.Executor) executor);
        }
        Context context = tomcat.addContext("", base.getAbsolutePath());
        Tomcat.addServlet(context, "dispatcher", new DispatcherServlet(spring)).setLoadOnStartup(1);
        context.addServletMappingDecoded("/", "dispatcher");
        tomcat.start();
        System.out.println("ready");
        System.out.flush();
        tomcat.getServer().await();
    }

    // The dispatcher's default adapter with Jackson to read and write request and response bodies.
    public static class JsonHandlerAdapter extends RequestMappingHandlerAdapter {
        public JsonHandlerAdapter() {
            getMessageConverters().add(0, new MappingJackson2HttpMessageConverter());
        }
    }

    // Generated products and customers the controller prices orders against.
    public static final class Catalogue {
        final Map<String, BigDecimal> prices = new LinkedHashMap<>();
        final Map<Integer, List<Line>> history = new ConcurrentHashMap<>();

        Catalogue() {
            long seed = 11;
            for (int p = 0; p < 120; p++) {
                seed = seed * 6364136223846793005L + 1442695040888963407L;
                prices.put("sku-" + p, BigDecimal.valueOf((seed >>> 40) % 50_000, 2));
            }
            for (int c = 0; c < 500; c++) {
                List<Line> lines = new ArrayList<>();
                for (int l = 0; l < 40; l++) {
                    seed = seed * 6364136223846793005L + 1442695040888963407L;
                    Line line = new Line();
                    line.sku = "sku-" + ((seed >>> 33) % prices.size());
                    line.quantity = 1 + (int) ((seed >>> 50) % 9);
                    line.day = LocalDate.of(2026, 1, 1).plusDays((seed >>> 20) % 300).toString();
                    lines.add(line);
                }
                history.put(c, lines);
            }
        }
    }

    public static final class Line {
        public String sku;
        public int quantity;
        public String day;
    }

    public static final class Quote {
        public String customer;
        public List<Line> lines = new ArrayList<>();
    }

    public static final class Priced {
        public String sku;
        public int quantity;
        public BigDecimal unit;
        public BigDecimal total;
    }

    public static final class QuoteResult {
        public String customer;
        public List<Priced> lines = new ArrayList<>();
        public BigDecimal subtotal = BigDecimal.ZERO;
        public BigDecimal tax;
        public BigDecimal total;
    }

    @RestController
    public static class OrderController {
        private final Catalogue catalogue;

        public OrderController() {
            this.catalogue = new Catalogue();
        }

        // JSON in (Jackson), prices looked up and summed in BigDecimal, JSON out.
        @RequestMapping(value = "/quote", method = RequestMethod.POST)
        public QuoteResult quote(@RequestBody Quote quote) {
            QuoteResult result = new QuoteResult();
            result.customer = quote.customer;
            for (Line line : quote.lines) {
                Priced priced = new Priced();
                priced.sku = line.sku;
                priced.quantity = line.quantity;
                priced.unit = catalogue.prices.getOrDefault(line.sku, BigDecimal.ONE);
                priced.total = priced.unit.multiply(BigDecimal.valueOf(line.quantity));
                result.lines.add(priced);
                result.subtotal = result.subtotal.add(priced.total);
            }
            result.tax = result.subtotal.multiply(new BigDecimal("0.2")).setScale(2, RoundingMode.HALF_EVEN);
            result.total = result.subtotal.add(result.tax);
            return result;
        }

        // A customer's history grouped per month and product with streams, rendered by Jackson.
        @RequestMapping(value = "/customers/{id}/summary", method = RequestMethod.GET)
        public Map<String, Object> summary(@PathVariable("id") int id,
                @RequestParam(value = "top", defaultValue = "5") int top) {
            List<Line> lines = catalogue.history.getOrDefault(id % 500, new ArrayList<>());
            Map<String, Map<String, Integer>> perMonth = lines.stream().collect(Collectors.groupingBy(
                    line -> LocalDate.parse(line.day).getMonth().toString(),
                    Collectors.groupingBy(line -> line.sku, Collectors.summingInt(line -> line.quantity))));
            List<Map.Entry<String, BigDecimal>> spend = lines.stream()
                    .collect(Collectors.toMap(line -> line.sku,
                            line -> catalogue.prices.get(line.sku).multiply(BigDecimal.valueOf(line.quantity)),
                            BigDecimal::add))
                    .entrySet().stream()
                    .sorted(Map.Entry.<String, BigDecimal>comparingByValue(Comparator.reverseOrder()))
                    .limit(top)
                    .collect(Collectors.toList());
            Map<String, Object> out = new LinkedHashMap<>();
            out.put("customer", id);
            out.put("months", perMonth);
            out.put("top", spend);
            return out;
        }
    }
}
