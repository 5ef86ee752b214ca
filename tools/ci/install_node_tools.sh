#!/usr/bin/env bash
# Install the Node tools the tests drive: the MCP Inspector CLI (npm
# @modelcontextprotocol/inspector, pinned below), into .ci/node/ of this checkout (gitignored),
# for tests/mcp_server/test_mcp_inspector.py. Installs Debian's nodejs and npm first when node or npm
# is missing (as root, or with sudo, as .ci/run does for postgresql). Idempotent: a second
# run with the pinned version in place does nothing.
set -euo pipefail
cd "$(dirname "$0")/../.."

INSPECTOR_VERSION="2.12.0"  # keep in step with tests/mcp_server/test_mcp_inspector.py
NODE_FALLBACK="22"          # a project-local Node when the system one is older than 20
PREFIX=".ci/node"
BIN="$PREFIX/node_modules/.bin"

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    $sudo apt-get update -q
    $sudo env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -q --no-install-recommends nodejs npm
fi

mkdir -p "$PREFIX"
npm_install() {
    npm install --prefix "$PREFIX" --save-exact --no-audit --no-fund --loglevel=error "$@"
}

# The inspector wants a recent Node (its package says >= 22; it runs on 20). Debian 12's
# nodejs is 18: then Node itself comes from npm (the `node` package), into the prefix,
# and the tests put $BIN first on PATH.
major="$(node -p 'process.versions.node.split(".")[0]')"
if [ "$major" -lt 20 ] && [ ! -x "$BIN/node" ]; then
    npm_install "node@$NODE_FALLBACK"
fi
export PATH="$PWD/$BIN:$PATH"

have="$(node -p "try { require('./$PREFIX/node_modules/@modelcontextprotocol/inspector/package.json').version } catch (e) { '' }")"
if [ "$have" != "$INSPECTOR_VERSION" ]; then
    npm_install "@modelcontextprotocol/inspector@$INSPECTOR_VERSION"
fi

"$BIN/mcp-inspector" --cli --version >/dev/null
echo "install_node_tools: node $(node --version), MCP Inspector $INSPECTOR_VERSION in $PREFIX"
