#!/bin/sh
# Per-call latency of nexus-mcp beside the TypeScript Pinecone MCP server,
# both over stdio against the same fake Pinecone (see benches/README.md,
# "Side by side with the TypeScript server"). Environment:
# TS_MCP_DIR=<pinecone-mcp checkout after npm ci && npm run build> (without
# it only nexus-mcp is measured), NEXUS_MCP_BIN=<another nexus-mcp>,
# SIDE_BY_SIDE_CALLS / SIDE_BY_SIDE_ROUNDS / SIDE_BY_SIDE_WARM_UP.
set -eu
cd "$(dirname "$0")/../.."
if [ -n "${TS_MCP_DIR:-}" ]; then
    command -v node >/dev/null || { echo "node is required" >&2; exit 1; }
    [ -f "$TS_MCP_DIR/dist/index.js" ] || {
        echo "$TS_MCP_DIR/dist/index.js is missing: npm ci && npm run build there" >&2
        exit 1
    }
fi
if [ -z "${NEXUS_MCP_BIN:-}" ]; then
    cargo build --release --features mcp,cli --bin nexus-mcp
fi
# Optimised, so that the in-process fake answers both servers quickly.
cargo bench --features mcp --bench side_by_side
