#!/usr/bin/env bash
# Spark 4 runs on Java 17 or newer; say how to get it instead of failing deep inside py4j.
set -euo pipefail
java_bin="${JAVA_HOME:+$JAVA_HOME/bin/}java"
if ! command -v "$java_bin" >/dev/null 2>&1; then
    echo "error: Java 17+ is required by Spark 4 and no 'java' was found." >&2
    echo "  Debian/Ubuntu: sudo apt-get install -y openjdk-17-jre-headless" >&2
    echo "  macOS:         brew install openjdk@17" >&2
    echo "  or set JAVA_HOME to a JDK 17+ installation." >&2
    exit 1
fi
version=$("$java_bin" -version 2>&1 | awk -F'"' '/version/ {print $2; exit}')
major=${version%%.*}
if [ "$major" = "1" ]; then major=$(echo "$version" | cut -d. -f2); fi
if [ "${major:-0}" -lt 17 ]; then
    echo "error: Java $version found, Spark 4 needs Java 17+ (set JAVA_HOME or install openjdk-17)." >&2
    exit 1
fi
