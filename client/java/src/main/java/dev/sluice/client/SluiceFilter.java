package dev.sluice.client;

import jakarta.servlet.Filter;
import jakarta.servlet.FilterChain;
import jakarta.servlet.FilterConfig;
import jakarta.servlet.ServletException;
import jakarta.servlet.ServletRequest;
import jakarta.servlet.ServletResponse;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.Objects;
import java.util.function.Function;

/**
 * A servlet filter that asks sluice before each request: one unit of `rule`
 * for the key that `keyOf` picks from the request (null: the request is not
 * limited). An allowed request goes on with the RateLimit and
 * RateLimit-Policy headers set; a denied one is answered 429 with those
 * headers, Retry-After and a small JSON body:
 * {@code {"error":"rate_limited","rule":"api","retry_after_s":3}}.
 * When the daemon is unreachable the client's {@link UnreachablePolicy}
 * decides and the RateLimit headers are left out (the limit is unknown).
 * A daemon error (an unknown rule, say) is a ServletException.
 *
 * <pre>
 *   SluiceClient sluice = new SluiceClient(new SluiceClient.Options());
 *   context.addFilter("sluice", new SluiceFilter(sluice, "api", SluiceFilter.clientIp()))
 *       .addMappingForUrlPatterns(null, false, "/*");
 * </pre>
 *
 * In web.xml, the no-argument constructor reads the init parameters
 * {@code socket} (default the client's), {@code rule} (required), {@code key}
 * ("remote-addr", the default, "remote-user", or "header:NAME"),
 * {@code window-seconds}, {@code timeout-ms} and {@code unreachable}
 * ("fail_open" or "fail_closed").
 */
public final class SluiceFilter implements Filter {
  private SluiceClient client;
  private boolean ownsClient;
  private String rule;
  private Function<HttpServletRequest, String> keyOf;
  private long windowS;

  /** For web.xml: configured by {@link #init}'s parameters. */
  public SluiceFilter() {}

  public SluiceFilter(SluiceClient client, String rule, Function<HttpServletRequest, String> keyOf) {
    this.client = Objects.requireNonNull(client, "client");
    this.rule = Objects.requireNonNull(rule, "rule");
    this.keyOf = Objects.requireNonNull(keyOf, "keyOf");
    RateLimitHeaders.format(true, 0, 0, 0, 0, rule, 0); // the rule must be a valid policy name
  }

  /** The window of the rule in seconds, for RateLimit-Policy's w (omitted when 0). */
  public SluiceFilter windowSeconds(long seconds) {
    this.windowS = seconds;
    return this;
  }

  /** The key: the client's address. */
  public static Function<HttpServletRequest, String> clientIp() {
    return HttpServletRequest::getRemoteAddr;
  }

  /** The key: a header's value (e.g. an API key); requests without it are not limited. */
  public static Function<HttpServletRequest, String> header(String name) {
    return request -> request.getHeader(name);
  }

  /** The key: the authenticated user's name; anonymous requests are not limited. */
  public static Function<HttpServletRequest, String> user() {
    return HttpServletRequest::getRemoteUser;
  }

  @Override
  public void init(FilterConfig config) throws ServletException {
    if (client != null) {
      return;
    }
    rule = config.getInitParameter("rule");
    if (rule == null || rule.isEmpty()) {
      throw new ServletException("SluiceFilter: the init parameter rule is required");
    }
    SluiceClient.Options options = new SluiceClient.Options();
    String socket = config.getInitParameter("socket");
    if (socket != null) {
      options.socketPath(socket);
    }
    try {
      String timeout = config.getInitParameter("timeout-ms");
      if (timeout != null) {
        options.timeoutMs(Long.parseLong(timeout.trim()));
      }
      String window = config.getInitParameter("window-seconds");
      if (window != null) {
        windowS = Long.parseLong(window.trim());
      }
    } catch (NumberFormatException e) {
      throw new ServletException("SluiceFilter: " + e.getMessage(), e);
    }
    String unreachable = config.getInitParameter("unreachable");
    if (unreachable != null) {
      options.unreachablePolicy(UnreachablePolicy.valueOf(unreachable.trim().toUpperCase()));
    }
    String key = config.getInitParameter("key");
    if (key == null || key.equals("remote-addr")) {
      keyOf = clientIp();
    } else if (key.equals("remote-user")) {
      keyOf = user();
    } else if (key.startsWith("header:")) {
      keyOf = header(key.substring("header:".length()));
    } else {
      throw new ServletException("SluiceFilter: key must be remote-addr, remote-user or header:NAME");
    }
    client = new SluiceClient(options);
    ownsClient = true;
  }

  @Override
  public void doFilter(ServletRequest request, ServletResponse response, FilterChain chain)
      throws IOException, ServletException {
    if (!(request instanceof HttpServletRequest) || !(response instanceof HttpServletResponse)) {
      chain.doFilter(request, response);
      return;
    }
    HttpServletRequest http = (HttpServletRequest) request;
    HttpServletResponse out = (HttpServletResponse) response;
    String key = keyOf.apply(http);
    if (key == null) {
      chain.doFilter(request, response);
      return;
    }
    Decision decision;
    try {
      decision = client.acquire(rule, key);
    } catch (SluiceException e) {
      throw new ServletException("sluice: " + e.getMessage(), e);
    }
    RateLimitHeaders headers = RateLimitHeaders.format(decision, rule, windowS);
    if (!decision.unreachable()) {
      out.setHeader("RateLimit", headers.rateLimit());
      out.setHeader("RateLimit-Policy", headers.rateLimitPolicy());
    }
    if (decision.allowed()) {
      chain.doFilter(request, response);
      return;
    }
    out.setStatus(429);
    out.setHeader("Retry-After", headers.retryAfter());
    out.setContentType("application/json");
    out.setCharacterEncoding("UTF-8");
    byte[] body = ("{\"error\":\"rate_limited\",\"rule\":" + jsonString(rule)
        + ",\"retry_after_s\":" + headers.retryAfter() + "}\n").getBytes(StandardCharsets.UTF_8);
    out.setContentLength(body.length);
    out.getOutputStream().write(body);
  }

  @Override
  public void destroy() {
    if (ownsClient) {
      client.close();
    }
  }

  /** A JSON string of printable ASCII (a valid policy name is). */
  private static String jsonString(String text) {
    return "\"" + text.replace("\\", "\\\\").replace("\"", "\\\"") + "\"";
  }
}
