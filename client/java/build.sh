#!/bin/sh
# build.sh OUT_DIR: compiles the Java client into OUT_DIR with javac and jar
# (no Maven: its repositories are not reachable here). Produces
#   OUT_DIR/sluice-client.jar   the library (needs msgpack-core.jar, and
#                               jakarta-servlet-api.jar for SluiceFilter)
#   OUT_DIR/test-classes/       the tests (unless SKIP_TESTS=1)
#   OUT_DIR/bench-classes/      the bench program
# Dependencies come from Debian: libmsgpack-java, libjakarta-servlet-api-java,
# junit5 and libtomcat10-java (the tests' servlet container).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: build.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
J=/usr/share/java
lib_cp=$J/msgpack-core.jar:$J/jakarta-servlet-api.jar
javac_flags="--release 17 -Xlint:all -Werror -encoding UTF-8"

rm -rf "$out/classes" "$out/test-classes" "$out/bench-classes"
mkdir -p "$out/classes" "$out/test-classes" "$out/bench-classes"
# shellcheck disable=SC2046
javac $javac_flags -cp "$lib_cp" -d "$out/classes" $(find "$here/src/main/java" -name '*.java')
jar --create --file "$out/sluice-client.jar" -C "$out/classes" .

javac $javac_flags -cp "$out/sluice-client.jar:$J/msgpack-core.jar" -d "$out/bench-classes" \
  "$here/bench/Bench.java"

if [ "${SKIP_TESTS:-0}" != 1 ]; then
  test_cp=$out/sluice-client.jar:$J/msgpack-core.jar:$J/tomcat10-servlet-api.jar
  test_cp=$test_cp:$J/junit-jupiter-api.jar:$J/apiguardian-api.jar:$J/opentest4j.jar
  test_cp=$test_cp:$J/junit-platform-commons.jar
  test_cp=$test_cp:$J/tomcat10-catalina.jar:$J/tomcat10-coyote.jar:$J/tomcat10-util.jar
  test_cp=$test_cp:$J/tomcat10-util-scan.jar:$J/tomcat10-api.jar:$J/tomcat10-juli.jar
  javac $javac_flags -Xlint:-processing -cp "$test_cp" -d "$out/test-classes" \
    $(find "$here/src/test/java" -name '*.java')
fi
