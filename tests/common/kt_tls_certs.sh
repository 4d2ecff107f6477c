#!/usr/bin/env bash
# Throwaway TLS files for the etcd TLS tests, in directory $1 (openssl CLI):
#   ca.crt/.key         the CA that signs etcd's server certificate and the client's
#   server.crt/.key     etcd's, SAN IP:127.0.0.1 only (so that "localhost" is a
#                       name the certificate does not list)
#   client.crt/.key     a client certificate signed by ca (CN kvl-client)
#   otherca.crt/.key    another CA (the wrong CA)
#   stranger.crt/.key   a client certificate signed by otherca (etcd refuses it)
# EC P-256 keys, valid 2 days. Exit status: openssl's.
set -euo pipefail
cd "$1"
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1"; }
ca() {
    key "$1.key"
    openssl req -x509 -new -key "$1.key" -out "$1.crt" -days 2 -subj "/CN=kvl-test-$1"
}
leaf() { # name ca cn extensions
    key "$1.key"
    openssl req -new -key "$1.key" -out "$1.csr" -subj "/CN=$3"
    printf '%s\n' "$4" >"$1.ext"
    openssl x509 -req -in "$1.csr" -CA "$2.crt" -CAkey "$2.key" -CAcreateserial \
        -out "$1.crt" -days 2 -extfile "$1.ext"
}
{
    ca ca
    ca otherca
    # etcd's gateway dials its own gRPC server with this certificate: clientAuth too
    leaf server ca kvl-etcd "subjectAltName=IP:127.0.0.1
extendedKeyUsage=serverAuth,clientAuth"
    leaf client ca kvl-client "extendedKeyUsage=clientAuth"
    leaf stranger otherca kvl-stranger "extendedKeyUsage=clientAuth"
} >kt_tls_certs.log 2>&1
chmod 600 ./*.key
