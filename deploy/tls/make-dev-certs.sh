#!/usr/bin/env bash
# Makes a throwaway CA and the certificates a development cluster needs, with openssl:
#
#   deploy/tls/make-dev-certs.sh [OUT_DIR]      (default: deploy/tls/out, which git ignores)
#
#   ca.crt, ca.key            the development CA (workers and axctl trust ca.crt)
#   scheduler.crt/.key        the schedulers' serving certificate, valid for scheduler-1..3
#                             (docker-compose.yml's nodes), the Kubernetes Service names,
#                             localhost and 127.0.0.1
#   worker-1.crt/.key, ...    client certificates naming each worker id (for --tls-client-ca);
#                             the ids are the arguments after OUT_DIR, default worker-1 worker-2
#   secret-key                32 random bytes, base64: the key ax encrypts stored secrets with
#                             (--secret-key-file)
#
# These keys are for a development machine only: they are readable by every user (so the
# containers' `ax` user can read them through a bind mount) and the CA key sits beside them.
# A real cluster gets its certificates from its own CA or cert-manager. Existing files are
# kept, so running it again changes nothing; delete the directory to start over.
set -euo pipefail

out="${1:-$(dirname "$0")/out}"
shift || true
workers=("$@")
if [ ${#workers[@]} -eq 0 ]; then
  workers=(worker-1 worker-2)
fi
command -v openssl >/dev/null || { echo "make-dev-certs.sh: openssl is not installed" >&2; exit 1; }
mkdir -p "$out"
cd "$out"

days=825
if [ ! -f ca.crt ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days "$days" \
    -subj "/CN=ax development CA" -keyout ca.key -out ca.crt \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    2>/dev/null
  echo "wrote $out/ca.crt"
fi

# issue NAME SUBJECT_ALT_NAMES EXTENDED_KEY_USAGE
issue() {
  local name=$1 sans=$2 usage=$3
  if [ -f "$name.crt" ]; then
    return
  fi
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$name" \
    -keyout "$name.key" -out "$name.csr" 2>/dev/null
  openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days "$days" \
    -out "$name.crt" -extfile <(printf 'subjectAltName=%s\nextendedKeyUsage=%s\nbasicConstraints=CA:FALSE\n' "$sans" "$usage") \
    2>/dev/null
  rm -f "$name.csr"
  echo "wrote $out/$name.crt"
}

issue scheduler "DNS:scheduler-1,DNS:scheduler-2,DNS:scheduler-3,DNS:ax-scheduler,DNS:ax-scheduler.ax.svc,DNS:ax-scheduler.ax.svc.cluster.local,DNS:ax-scheduler-headless.ax.svc.cluster.local,DNS:localhost,IP:127.0.0.1" serverAuth
for id in "${workers[@]}"; do
  issue "$id" "DNS:$id" clientAuth
done
if [ ! -f secret-key ]; then
  openssl rand -base64 32 > secret-key
  echo "wrote $out/secret-key"
fi
# Readable by the containers' user, whatever its uid (development only, see above); the CA's
# key stays the owner's.
chmod 0644 ./*.crt ./*.key secret-key
chmod 0600 ca.key
