#!/bin/sh
# run_tests.sh OUT_DIR CLASS...: runs JUnit 5 test classes (simple names in
# dev.sluice.client) built by build.sh OUT_DIR, with Debian's console launcher.
set -eu
out=${1:?usage: run_tests.sh OUT_DIR CLASS...}
shift
J=/usr/share/java
cp=$out/test-classes:$out/sluice-client.jar:$J/msgpack-core.jar
cp=$cp:$J/tomcat10-servlet-api.jar:$J/tomcat10-catalina.jar:$J/tomcat10-coyote.jar
cp=$cp:$J/tomcat10-util.jar:$J/tomcat10-util-scan.jar:$J/tomcat10-api.jar:$J/tomcat10-juli.jar
cp=$cp:$J/tomcat10-jaspic-api.jar:$J/tomcat10-annotations-api.jar
selectors=
for class in "$@"; do
  selectors="$selectors --select-class=dev.sluice.client.$class"
done
# shellcheck disable=SC2086
exec java -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -jar "$J/junit-platform-console-standalone.jar" \
  --class-path "$cp" --disable-banner --disable-ansi-colors --exclude-engine=junit-vintage --fail-if-no-tests --details=tree $selectors
