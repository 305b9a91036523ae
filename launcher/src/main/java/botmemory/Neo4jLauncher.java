package botmemory;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicReference;
import org.neo4j.configuration.GraphDatabaseSettings;
import org.neo4j.configuration.connectors.BoltConnector;
import org.neo4j.configuration.connectors.BoltConnectorInternalSettings;
import org.neo4j.configuration.connectors.HttpConnector;
import org.neo4j.configuration.connectors.HttpsConnector;
import org.neo4j.configuration.helpers.SocketAddress;
import org.neo4j.dbms.api.DatabaseManagementService;
import org.neo4j.dbms.api.DatabaseManagementServiceBuilder;
import org.neo4j.graphdb.GraphDatabaseService;
import org.neo4j.io.ByteUnit;

/**
 * Runs a Neo4j Community 5.26 DBMS in this JVM with Bolt on 127.0.0.1 only (no HTTP, no routing).
 *
 * <p>Usage (classpath = target/classes and target/lib/*, built by launcher/pom.xml):
 *
 * <pre>
 * java --add-opens=java.base/java.nio=ALL-UNNAMED ... -Xmx1g \
 *     -cp 'target/classes:target/lib/*' botmemory.Neo4jLauncher \
 *     --home DIR --port 7687 --password-file FILE --plugins target/plugins [--pagecache 512m]
 * </pre>
 *
 * <ul>
 *   <li>{@code --home}: persistent Neo4j home; databases live in {@code DIR/data}, logs in {@code
 *       DIR/logs}.
 *   <li>Authentication is on. The password of user {@code neo4j} is the content of {@code
 *       --password-file}. On the first start it is set with Bolt still off, so the default
 *       neo4j/neo4j account is never reachable; later starts keep it (and adopt the file if it
 *       changed).
 *   <li>APOC must be on the classpath (its extension factories) and in {@code --plugins} (its
 *       procedures); {@code apoc.*} is unrestricted and allow-listed.
 *   <li>SIGTERM runs a shutdown hook that stops the DBMS cleanly (checkpoint, no recovery later).
 *   <li>Prints {@code NEO4J_READY bolt://127.0.0.1:PORT} once the {@code neo4j} database answers.
 * </ul>
 */
public final class Neo4jLauncher {
  private Neo4jLauncher() {}

  public static void main(String[] argv) throws Exception {
    Map<String, String> args = parseArgs(argv);
    Path home = Path.of(required(args, "home")).toAbsolutePath();
    int port = Integer.parseInt(args.getOrDefault("port", "7687"));
    Path plugins = Path.of(required(args, "plugins")).toAbsolutePath();
    long pagecache = ByteUnit.parse(args.getOrDefault("pagecache", "512m"));
    String password = readPassword(Path.of(required(args, "password-file")));
    Files.createDirectories(home);

    AtomicReference<DatabaseManagementService> running = new AtomicReference<>();
    CountDownLatch stopped = new CountDownLatch(1);
    Runtime.getRuntime()
        .addShutdownHook(
            new Thread(
                () -> {
                  DatabaseManagementService dbms = running.getAndSet(null);
                  if (dbms != null) {
                    log("NEO4J_STOPPING");
                    dbms.shutdown();
                    log("NEO4J_STOPPED");
                  }
                  stopped.countDown();
                },
                "neo4j-shutdown"));

    try {
      boolean fresh = !Files.isDirectory(home.resolve("data/databases/system"));
      if (fresh) {
        running.set(builder(home, port, plugins, pagecache, false).build());
        setPassword(running.get(), password);
        running.getAndSet(null).shutdown();
      }
      running.set(builder(home, port, plugins, pagecache, true).build());
      if (!fresh) {
        setPassword(running.get(), password);
      }
      running.get().database(GraphDatabaseSettings.DEFAULT_DATABASE_NAME).executeTransactionally("RETURN 1");
    } catch (Exception | Error e) {
      System.err.println("NEO4J_FAILED " + e);
      e.printStackTrace();
      System.exit(1); // runs the hook, which stops a half-started DBMS
    }
    log("NEO4J_READY bolt://127.0.0.1:" + port + " home=" + home);
    stopped.await();
  }

  private static DatabaseManagementServiceBuilder builder(
      Path home, int port, Path plugins, long pagecache, boolean bolt) {
    SocketAddress address = new SocketAddress("127.0.0.1", port);
    return new DatabaseManagementServiceBuilder(home)
        .setConfig(GraphDatabaseSettings.strict_config_validation, true)
        .setConfig(GraphDatabaseSettings.auth_enabled, true)
        .setConfig(GraphDatabaseSettings.udc_enabled, false)
        .setConfig(GraphDatabaseSettings.routing_enabled, false)
        .setConfig(GraphDatabaseSettings.default_listen_address, new SocketAddress("127.0.0.1"))
        .setConfig(GraphDatabaseSettings.default_advertised_address, new SocketAddress("127.0.0.1"))
        .setConfig(GraphDatabaseSettings.pagecache_memory, pagecache)
        // A local stack keeps at most 512 MiB of transaction logs (the default keeps 2 days of them:
        // over 4 GB after a day of benchmarks); recovery needs only those since the last checkpoint.
        .setConfig(GraphDatabaseSettings.keep_logical_logs, "512M size")
        .setConfig(GraphDatabaseSettings.plugin_dir, plugins)
        .setConfig(GraphDatabaseSettings.procedure_unrestricted, List.of("apoc.*"))
        .setConfig(GraphDatabaseSettings.procedure_allowlist, List.of("apoc.*"))
        .setConfig(BoltConnector.enabled, bolt)
        .setConfig(BoltConnector.listen_address, address)
        .setConfig(BoltConnector.advertised_address, address)
        // While it works on a request, Neo4j sends a NOOP on a connection quiet for a second, and
        // its connection.recv_timeout_seconds hint (the interval times the probes) tells the
        // driver to give a connection up after that much silence: a Neo4j that stops answering
        // fails a request within seconds, while a long transaction, NOOPs arriving, goes on.
        // Neo4j's defaults (1 min x 2) leave a request waiting 2 min on a silent connection.
        .setConfig(BoltConnector.connection_keep_alive_type, BoltConnector.KeepAliveRequestType.ALL)
        .setConfig(BoltConnector.connection_keep_alive, Duration.ofSeconds(1))
        .setConfig(BoltConnector.connection_keep_alive_probes, 5)
        // Without these, stopping Bolt waits 2 x 5 s after the databases are already closed.
        .setConfig(BoltConnectorInternalSettings.connection_shutdown_wait_time, Duration.ofSeconds(1))
        .setConfig(BoltConnectorInternalSettings.thread_pool_shutdown_wait_time, Duration.ofSeconds(1))
        .setConfig(HttpConnector.enabled, false)
        .setConfig(HttpsConnector.enabled, false);
  }

  /** Makes the password of user neo4j equal to {@code password} (a no-op when it already is). */
  private static void setPassword(DatabaseManagementService dbms, String password) {
    GraphDatabaseService system = dbms.database(GraphDatabaseSettings.SYSTEM_DATABASE_NAME);
    try {
      system.executeTransactionally(
          "ALTER USER neo4j SET PASSWORD $pw CHANGE NOT REQUIRED", Map.of("pw", password));
      log("NEO4J_PASSWORD_SET user=neo4j");
    } catch (RuntimeException e) {
      if (!messages(e).contains("Old password and new password cannot be the same")) {
        throw e;
      }
      log("NEO4J_PASSWORD_KEPT user=neo4j");
    }
  }

  private static void log(String line) {
    System.out.println(line);
    System.out.flush();
  }

  private static String messages(Throwable e) {
    StringBuilder sb = new StringBuilder();
    for (Throwable t = e; t != null; t = t.getCause()) {
      sb.append(t.getMessage()).append('\n');
    }
    return sb.toString();
  }

  private static String readPassword(Path file) throws IOException {
    String pw = Files.readString(file, StandardCharsets.UTF_8).strip();
    if (pw.length() < 8) {
      throw new IllegalArgumentException("the password in " + file + " needs 8+ characters");
    }
    return pw;
  }

  private static String required(Map<String, String> args, String key) {
    String value = args.get(key);
    if (value == null || value.isEmpty()) {
      throw new IllegalArgumentException("missing --" + key);
    }
    return value;
  }

  /** Parses {@code --key value} and {@code --key=value} pairs. */
  private static Map<String, String> parseArgs(String[] argv) {
    Map<String, String> out = new HashMap<>();
    for (int i = 0; i < argv.length; i++) {
      String a = argv[i];
      if (!a.startsWith("--")) {
        throw new IllegalArgumentException("unexpected argument: " + a);
      }
      int eq = a.indexOf('=');
      if (eq > 0) {
        out.put(a.substring(2, eq), a.substring(eq + 1));
      } else if (i + 1 < argv.length) {
        out.put(a.substring(2), argv[++i]);
      } else {
        throw new IllegalArgumentException("missing value for " + a);
      }
    }
    return out;
  }
}
