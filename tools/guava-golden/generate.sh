#!/usr/bin/env bash
# Regenerates crates/tollgate-core/tests/fixtures/guava.csv from the real Guava.
# Needs a JDK and Debian's libguava-java (apt-get install -y default-jdk-headless libguava-java).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
jar=/usr/share/java/guava.jar
[ -f "$jar" ] || { echo "missing $jar: apt-get install -y libguava-java" >&2; exit 1; }
build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
javac -nowarn -cp "$jar" -d "$build" "$here/GoldenVectors.java"
java -cp "$build:$jar" com.google.common.util.concurrent.GoldenVectors > "$root/crates/tollgate-core/tests/fixtures/guava.csv"
echo "wrote $(($(wc -l < "$root/crates/tollgate-core/tests/fixtures/guava.csv") - 1)) vectors from $(readlink -f "$jar")"
