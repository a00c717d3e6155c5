package dev.sluice.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import jakarta.servlet.Filter;
import jakarta.servlet.http.HttpServlet;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import java.io.IOException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.logging.Level;
import java.util.logging.Logger;
import org.apache.catalina.Context;
import org.apache.catalina.LifecycleException;
import org.apache.catalina.Wrapper;
import org.apache.catalina.startup.Tomcat;
import org.apache.tomcat.util.descriptor.web.FilterDef;
import org.apache.tomcat.util.descriptor.web.FilterMap;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/** SluiceFilter in a real servlet container: Debian's Tomcat 10.1, embedded. */
class FilterTest {
  static final String RULES = String.join("\n",
      "[[rule]]", "name = \"api\"", "algorithm = \"fixed_window\"", "limit = 2", "period = \"1h\"",
      "");

  // Tomcat logs each start and stop, and embedded it warns at every stop
  // about leak checks meant for deployed webapps (JDBC, ThreadLocal, RMI):
  // its warnings are shown, and of its class loader only the errors.
  static final Logger TOMCAT_LOG = Logger.getLogger("org.apache");
  static final Logger TOMCAT_LOADER_LOG = Logger.getLogger("org.apache.catalina.loader");

  static Daemon daemon;
  static SluiceClient client;
  // The servers' base dirs. Tomcat keeps the first one's as catalina.base
  // for the JVM and may write there after that server stopped, so the tree
  // is removed once, after the last server.
  static Path tomcatRoot;

  static void removeTree(Path root) throws IOException {
    if (!Files.exists(root)) {
      return;
    }
    try (var paths = Files.walk(root)) {
      paths.sorted(java.util.Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
    }
    if (Files.exists(root)) {
      try (var paths = Files.walk(root)) {
        throw new IOException("left behind: " + paths.toList());
      }
    }
  }
  static final HttpClient http = HttpClient.newHttpClient();

  @BeforeAll
  static void startDaemon() throws Exception {
    TOMCAT_LOG.setLevel(Level.WARNING);
    TOMCAT_LOADER_LOG.setLevel(Level.SEVERE);
    tomcatRoot = Files.createTempDirectory(Path.of("/tmp"), "slt.");
    daemon = new Daemon(RULES).start();
    client = SluiceClient.connect(
        new SluiceClient.Options().socketPath(daemon.socket).timeoutMs(10_000));
  }

  @AfterAll
  static void stopDaemon() throws Exception {
    client.close();
    daemon.close();
    removeTree(tomcatRoot);
  }

  /** A Tomcat on a free port serving "hello" at /*, behind `filter`. */
  static final class Server implements AutoCloseable {
    final Tomcat tomcat = new Tomcat();
    final Path base;

    Server(Filter filter) throws IOException, LifecycleException {
      this(filterDef(filter));
    }

    static FilterDef filterDef(Filter filter) {
      FilterDef def = new FilterDef();
      def.setFilter(filter);
      return def;
    }

    Server(FilterDef def) throws IOException, LifecycleException {
      base = Files.createTempDirectory(tomcatRoot, "t");
      tomcat.setBaseDir(base.toString());
      tomcat.setPort(0);
      tomcat.getConnector();
      Context context = tomcat.addContext("", base.toString());
      // The launcher loads these classes in a loader of its own: filters
      // named by class (as in web.xml) are found through it.
      context.setParentClassLoader(FilterTest.class.getClassLoader());
      Wrapper servlet = Tomcat.addServlet(context, "hello", new HttpServlet() {
        private static final long serialVersionUID = 1L;

        @Override
        protected void doGet(HttpServletRequest request, HttpServletResponse response)
            throws IOException {
          response.setContentType("text/plain");
          response.getWriter().write("hello");
        }
      });
      servlet.addMapping("/*");
      def.setFilterName("sluice");
      context.addFilterDef(def);
      FilterMap map = new FilterMap();
      map.setFilterName("sluice");
      map.addURLPattern("/*");
      context.addFilterMap(map);
      tomcat.start();
    }

    HttpResponse<String> get(String apiKey) throws IOException, InterruptedException {
      HttpRequest.Builder request = HttpRequest.newBuilder(URI.create(
          "http://127.0.0.1:" + tomcat.getConnector().getLocalPort() + "/things"));
      if (apiKey != null) {
        request.header("X-Api-Key", apiKey);
      }
      return http.send(request.build(), HttpResponse.BodyHandlers.ofString());
    }

    @Override
    public void close() throws LifecycleException, IOException {
      tomcat.stop();
      tomcat.destroy();
      removeTree(base);
    }
  }

  @Test
  void allowedRequestsGet200WithHeadersAndTheThirdGets429WithAJsonBody() throws Exception {
    SluiceFilter filter = new SluiceFilter(client, "api", SluiceFilter.header("X-Api-Key"))
        .windowSeconds(3600);
    try (Server server = new Server(filter)) {
      for (int remaining = 1; remaining >= 0; remaining--) {
        HttpResponse<String> ok = server.get("alice");
        assertEquals(200, ok.statusCode());
        assertEquals("hello", ok.body());
        String rateLimit = ok.headers().firstValue("RateLimit").orElse("");
        assertTrue(rateLimit.matches("\"api\";r=" + remaining + ";t=[0-9]+"), rateLimit);
        assertEquals("\"api\";q=2;w=3600", ok.headers().firstValue("RateLimit-Policy").orElse(""));
        assertFalse(ok.headers().firstValue("Retry-After").isPresent());
      }
      HttpResponse<String> denied = server.get("alice");
      assertEquals(429, denied.statusCode());
      String retryAfter = denied.headers().firstValue("Retry-After").orElse("");
      assertTrue(retryAfter.matches("[1-9][0-9]*") && Long.parseLong(retryAfter) <= 3600,
          retryAfter);
      assertTrue(denied.headers().firstValue("RateLimit").orElse("").matches(
          "\"api\";r=0;t=[0-9]+"));
      assertEquals("\"api\";q=2;w=3600",
          denied.headers().firstValue("RateLimit-Policy").orElse(""));
      assertTrue(denied.headers().firstValue("Content-Type").orElse("")
          .startsWith("application/json"));
      assertEquals("{\"error\":\"rate_limited\",\"rule\":\"api\",\"retry_after_s\":"
          + retryAfter + "}\n", denied.body());

      // Another key has its own limit; a request without a key is not limited.
      assertEquals(200, server.get("bob").statusCode());
      HttpResponse<String> anonymous = server.get(null);
      assertEquals(200, anonymous.statusCode());
      assertFalse(anonymous.headers().firstValue("RateLimit").isPresent());
    }
  }

  @Test
  void aFilterConfiguredByInitParametersLimitsByItsHeader() throws Exception {
    FilterDef def = new FilterDef();
    def.setFilterClass(SluiceFilter.class.getName());
    def.addInitParameter("socket", daemon.socket);
    def.addInitParameter("rule", "api");
    def.addInitParameter("key", "header:X-Api-Key");
    def.addInitParameter("window-seconds", "3600");
    def.addInitParameter("timeout-ms", "10000");
    def.addInitParameter("unreachable", "fail_closed");
    try (Server server = new Server(def)) {
      HttpResponse<String> first = server.get("erin");
      assertEquals(200, first.statusCode());
      assertTrue(first.headers().firstValue("RateLimit").orElse("").matches("\"api\";r=1;t=[0-9]+"));
      assertEquals("\"api\";q=2;w=3600", first.headers().firstValue("RateLimit-Policy").orElse(""));
      assertEquals(200, server.get("erin").statusCode());
      assertEquals(429, server.get("erin").statusCode());
    }
  }

  @Test
  void anUnreachableDaemonFailsClosedWith429WithoutRateLimitHeaders() throws Exception {
    try (SluiceClient closed = new SluiceClient(new SluiceClient.Options()
            .socketPath(daemon.dir.resolve("nothing.sock").toString())
            .unreachablePolicy(UnreachablePolicy.FAIL_CLOSED));
        Server server = new Server(new SluiceFilter(closed, "api", SluiceFilter.header("X-Api-Key")))) {
      HttpResponse<String> denied = server.get("carol");
      assertEquals(429, denied.statusCode());
      assertEquals("1", denied.headers().firstValue("Retry-After").orElse(""));
      assertFalse(denied.headers().firstValue("RateLimit").isPresent());
      assertEquals(1, closed.failedClosedCount());
    }
  }

  @Test
  void anUnreachableDaemonFailsOpenWith200() throws Exception {
    try (SluiceClient open = new SluiceClient(new SluiceClient.Options()
            .socketPath(daemon.dir.resolve("nothing.sock").toString()));
        Server server = new Server(new SluiceFilter(open, "api", SluiceFilter.header("X-Api-Key")))) {
      HttpResponse<String> ok = server.get("dave");
      assertEquals(200, ok.statusCode());
      assertEquals("hello", ok.body());
      assertEquals(1, open.failedOpenCount());
    }
  }
}
