#!/bin/sh
# Instructions per call of the optimised nexus-mcp, counted with callgrind
# (see benches/README.md, "Instructions per call"). Environment:
# CALLGRIND_ONLY=<scenario>, CALLGRIND_FEW / CALLGRIND_MANY (calls per run),
# NEXUS_MCP_BIN=<another nexus-mcp> to count another build.
set -eu
cd "$(dirname "$0")/../.."
command -v valgrind >/dev/null || { echo "valgrind is required" >&2; exit 1; }
if [ -z "${NEXUS_MCP_BIN:-}" ]; then
    cargo build --release --features mcp,cli --bin nexus-mcp
fi
# The driver's own speed does not matter: only the server is counted.
cargo bench --profile dev --features mcp,local,cli --bench callgrind_calls
