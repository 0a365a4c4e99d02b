#!/usr/bin/env bash
# certs.sh OUT REGION [NAMESPACE] — the mutual-TLS material the manifests
# mount, made with openssl (no cert-manager needed):
#
#   OUT/ca.crt, OUT/ca.key                 a CA (keep ca.key offline)
#   OUT/allot-coordinator-tls/{ca.crt,tls.crt,tls.key}
#        the coordinators' server certificate, for the names regions dial
#        (allot-coordinator-N.allot-coordinator[.NAMESPACE.svc[.cluster.local]])
#   OUT/allot-agent-tls/{ca.crt,tls.crt,tls.key}
#        the region's certificate: its common name is REGION (the
#        coordinator reads the region from it), a client certificate towards
#        the coordinators and the agent's server certificate (127.0.0.1 for
#        the gateway beside it, allot-agent for Prometheus)
#
# and prints the kubectl commands that store each directory as a Secret.
# Run it again with the same OUT for another region: the CA is kept.
# EXTRA_SANS (e.g. "IP:127.0.0.1") is added to the coordinators' names;
# the deploy tests use it to run the manifests on loopback.
set -euo pipefail
out=${1:?usage: certs.sh OUT REGION [NAMESPACE]}
region=${2:?usage: certs.sh OUT REGION [NAMESPACE]}
ns=${3:-allot}
days=${DAYS:-365}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$out"

if [ ! -f ca.key ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key -out ca.crt \
    -days "$days" -subj "/CN=allot CA" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
fi

# issue DIR CN SANS EKU: a key and a certificate signed by the CA.
issue() {
  local dir=$1 cn=$2 sans=$3 eku=$4
  mkdir -p "$dir"
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$dir/tls.key" \
    -out "$dir/tls.csr" -subj "/CN=$cn" 2>/dev/null
  printf 'subjectAltName=%s\nextendedKeyUsage=%s\nkeyUsage=critical,digitalSignature\nbasicConstraints=CA:FALSE\n' \
    "$sans" "$eku" >"$dir/ext.cnf"
  openssl x509 -req -in "$dir/tls.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days "$days" \
    -extfile "$dir/ext.cnf" -out "$dir/tls.crt" 2>/dev/null
  cp ca.crt "$dir/ca.crt"
  rm -f "$dir/tls.csr" "$dir/ext.cnf"
  chmod 600 "$dir/tls.key"
}

sans=""
for i in 0 1 2; do
  for suffix in "" ".$ns.svc" ".$ns.svc.cluster.local"; do
    sans="$sans,DNS:allot-coordinator-$i.allot-coordinator$suffix"
  done
done
sans="DNS:allot-coordinator,DNS:allot-coordinator.$ns.svc$sans${EXTRA_SANS:+,$EXTRA_SANS}"
issue allot-coordinator-tls allot-coordinator "$sans" serverAuth
issue allot-agent-tls "$region" "IP:127.0.0.1,DNS:localhost,DNS:allot-agent,DNS:allot-agent.$ns.svc" serverAuth,clientAuth

for s in allot-coordinator-tls allot-agent-tls; do
  echo "kubectl -n $ns create secret generic $s --from-file=$out/$s/ca.crt --from-file=$out/$s/tls.crt --from-file=$out/$s/tls.key"
done
