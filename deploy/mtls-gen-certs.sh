#!/usr/bin/env bash
# Certificates for sanctum-mlx's mTLS listener.
#
#   deploy/mtls-gen-certs.sh --out DIR [--host ADDR]... [--client NAME]...
#                            [--revoke NAME]... [--force] [--days N] [--crl-days N]
#                            [--expired-client NAME]...
#
# Writes
#   DIR/ca.crt, DIR/ca.key        self-signed EC P-256 CA, 5 years (kept across runs unless --force)
#   DIR/server.crt, server.key    server cert; SANs = every --host (IP or DNS name); reissued on
#                                 every run that names --host (or when missing: 127.0.0.1, ::1, localhost)
#   DIR/clients/NAME.{crt,key}    client certs, CN=NAME, extendedKeyUsage=clientAuth (kept unless --force)
#   DIR/crl.pem                   CRL of the CA, regenerated on every run; pass it as --tls-crl
# Keys are mode 0600. --revoke NAME revokes clients/NAME.crt and rewrites crl.pem.
# --expired-client NAME issues a certificate that expired in 2020 (for tests).
#
# The CRL carries a nextUpdate (--crl-days, default 30): the server refuses
# every client once it has passed, so re-run this script (any arguments)
# from cron to refresh it well before then.
#
# Server:  sanctum-mlx --tls-cert DIR/server.crt --tls-key DIR/server.key --tls-ca DIR/ca.crt \
#                      --tls-crl DIR/crl.pem --tls-host ADDR --tls-port 8443 --no-plain ...
# Client:  curl --cacert DIR/ca.crt --cert DIR/clients/NAME.crt --key DIR/clients/NAME.key https://ADDR:8443/health
set -euo pipefail

out=""; force=0; days=825; crl_days=30
hosts=(); clients=(); revokes=(); expired=()
die() { echo "mtls-gen-certs: $*" >&2; exit 1; }
usage() { sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
    case "$1" in
        --out) [ $# -ge 2 ] || die "--out needs a value"; out=$2; shift 2 ;;
        --host) [ $# -ge 2 ] || die "--host needs a value"; hosts+=("$2"); shift 2 ;;
        --client) [ $# -ge 2 ] || die "--client needs a value"; clients+=("$2"); shift 2 ;;
        --revoke) [ $# -ge 2 ] || die "--revoke needs a value"; revokes+=("$2"); shift 2 ;;
        --expired-client) [ $# -ge 2 ] || die "--expired-client needs a value"; expired+=("$2"); shift 2 ;;
        --days) [ $# -ge 2 ] || die "--days needs a value"; days=$2; shift 2 ;;
        --crl-days) [ $# -ge 2 ] || die "--crl-days needs a value"; crl_days=$2; shift 2 ;;
        --force) force=1; shift ;;
        -h|--help) usage 0 ;;
        *) echo "mtls-gen-certs: unknown argument '$1'" >&2; usage 2 ;;
    esac
done
[ -n "$out" ] || die "--out DIR is required"
[[ "$days" =~ ^[0-9]+$ ]] && [ "$days" -ge 1 ] || die "--days must be a positive integer"
[[ "$crl_days" =~ ^[0-9]+$ ]] && [ "$crl_days" -ge 1 ] || die "--crl-days must be a positive integer"
command -v openssl >/dev/null || die "openssl not found"
# Client names become file names and CNs: one safe alphabet, no path tricks.
for n in ${clients[@]+"${clients[@]}"} ${revokes[@]+"${revokes[@]}"} ${expired[@]+"${expired[@]}"}; do
    [[ "$n" =~ ^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$ ]] || die "bad client name '$n' (use [A-Za-z0-9._@-], at most 64)"
done
for h in ${hosts[@]+"${hosts[@]}"}; do
    [[ "$h" =~ ^[A-Za-z0-9.:_-]+$ ]] || die "bad host '$h'"
done

umask 077
mkdir -p "$out/clients" "$out/.ca/newcerts"
out=$(cd "$out" && pwd)
db="$out/.ca"
log="$db/openssl.log"
: > "$log"
run() { "$@" >>"$log" 2>&1 || { cat "$log" >&2; die "failed: $*"; }; }
newkey() { run openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1"; chmod 600 "$1"; }

cat > "$db/ca.cnf" <<EOF
[ ca ]
default_ca = sanctum_ca
[ sanctum_ca ]
database = $db/index.txt
new_certs_dir = $db/newcerts
serial = $db/serial
crlnumber = $db/crlnumber
certificate = $out/ca.crt
private_key = $out/ca.key
default_md = sha256
default_days = $days
default_crl_days = $crl_days
policy = policy_cn
unique_subject = no
copy_extensions = none
[ policy_cn ]
commonName = supplied
[ server_ext ]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
subjectAltName = @sans
[ client_ext ]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
[ crl_ext ]
authorityKeyIdentifier = keyid
EOF

new_ca=0
if [ "$force" = 1 ] || [ ! -s "$out/ca.crt" ] || [ ! -s "$out/ca.key" ]; then
    newkey "$out/ca.key"
    run openssl req -x509 -new -key "$out/ca.key" -sha256 -days 1826 -subj "/CN=sanctum mTLS CA" \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
        -addext "subjectKeyIdentifier=hash" -out "$out/ca.crt"
    # A new CA invalidates every certificate and revocation of the old one.
    : > "$db/index.txt"; rm -f "$db"/index.txt.* "$db"/newcerts/*.pem
    openssl rand -hex 16 > "$db/serial"; echo 1000 > "$db/crlnumber"
    new_ca=1
    echo "CA: created $out/ca.crt (EC P-256, 5 years)"
else
    echo "CA: keeping $out/ca.crt (use --force to replace it)"
fi
[ -f "$db/index.txt" ] || : > "$db/index.txt"
[ -s "$db/serial" ] || openssl rand -hex 16 > "$db/serial"
[ -s "$db/crlnumber" ] || echo 1000 > "$db/crlnumber"
chmod 644 "$out/ca.crt"

# issue NAME_FOR_FILES CN EXT OUT_PREFIX [extra openssl ca args...]
issue() {
    local cn=$2 ext=$3 prefix=$4; shift 4
    newkey "$prefix.key"
    run openssl req -new -key "$prefix.key" -subj "/CN=$cn" -out "$prefix.csr"
    run openssl ca -batch -config "$db/ca.cnf" -extensions "$ext" -notext -in "$prefix.csr" -out "$prefix.crt" "$@"
    rm -f "$prefix.csr"
    chmod 644 "$prefix.crt"
}

if [ ${#hosts[@]} -gt 0 ] || [ "$new_ca" = 1 ] || [ ! -s "$out/server.crt" ]; then
    [ ${#hosts[@]} -gt 0 ] || hosts=(127.0.0.1 ::1 localhost)
    {
        echo "[ sans ]"
        i=1; j=1
        for h in "${hosts[@]}"; do
            if [[ "$h" =~ ^[0-9.]+$ ]] || [[ "$h" == *:* ]]; then echo "IP.$i = $h"; i=$((i + 1))
            else echo "DNS.$j = $h"; j=$((j + 1)); fi
        done
    } >> "$db/ca.cnf"
    issue server "${hosts[0]}" server_ext "$out/server"
    echo "server: $out/server.crt for ${hosts[*]}"
fi

for n in ${clients[@]+"${clients[@]}"}; do
    if [ "$force" = 1 ] || [ "$new_ca" = 1 ] || [ ! -s "$out/clients/$n.crt" ]; then
        issue "$n" "$n" client_ext "$out/clients/$n"
        echo "client: $out/clients/$n.crt (CN=$n)"
    else
        echo "client: keeping $out/clients/$n.crt"
    fi
done
for n in ${expired[@]+"${expired[@]}"}; do
    issue "$n" "$n" client_ext "$out/clients/$n" -startdate 20200101000000Z -enddate 20200102000000Z
    echo "client: $out/clients/$n.crt (CN=$n, EXPIRED on purpose)"
done
for n in ${revokes[@]+"${revokes[@]}"}; do
    [ -s "$out/clients/$n.crt" ] || die "cannot revoke '$n': $out/clients/$n.crt does not exist"
    serial=$(openssl x509 -in "$out/clients/$n.crt" -noout -serial | cut -d= -f2)
    if grep -q "^R.*	$serial	" "$db/index.txt"; then
        echo "revoke: $n already revoked"
    else
        run openssl ca -batch -config "$db/ca.cnf" -revoke "$out/clients/$n.crt"
        echo "revoke: $n (serial $serial)"
    fi
done

run openssl ca -batch -config "$db/ca.cnf" -gencrl -crlexts crl_ext -out "$out/crl.pem"
chmod 644 "$out/crl.pem"
echo "crl: $out/crl.pem (valid $crl_days days)"
