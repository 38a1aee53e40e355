#!/bin/sh
# Makes the demo TLS certificate of the docker-compose setup (docs/DEPLOY.md)
# in the folder $1 unless one is there: a self-signed ECDSA P-256 certificate
# for the names coordinator, localhost and 127.0.0.1 that is its own CA
# (cert.pem, given to clients as the CA to trust) with its key (key.pem, mode
# 0600). It needs only the Go toolchain: the generator ships with Go's source.
#
# CERT_OWNER, when set (uid:gid), becomes the owner of both files, so that a
# coordinator running as that user can read the key.
set -eu
dir=${1:?usage: democerts.sh DIR}
mkdir -p "$dir"
cd "$dir"
if [ -s cert.pem ] && [ -s key.pem ]; then
	echo "democerts: $dir already holds cert.pem and key.pem; remove them to make new ones"
	exit 0
fi
go run "$(go env GOROOT)/src/crypto/tls/generate_cert.go" \
	--host coordinator,localhost,127.0.0.1 --ca --ecdsa-curve P256 --duration 8760h
if [ -n "${CERT_OWNER:-}" ]; then
	chown "$CERT_OWNER" cert.pem key.pem
fi
echo "democerts: wrote $dir/cert.pem and $dir/key.pem"
