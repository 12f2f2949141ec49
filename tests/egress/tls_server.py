"""An HTTPS server on 127.0.0.1 for the egress tests and bench (nothing leaves the machine).

argv: a directory (ca.pem, leaf.pem, leaf.key are written there) and the comma-separated
names of its certificate (127.0.0.1 too). Prints its port, then serves: `GET /x.csv` a small
CSV, `GET /big=N` N bytes, `GET /redirect?to=URL` a redirect, anything else the Host header
and the SNI it saw; each request's path, SNI and Authorization are appended to
seen.jsonl in the directory (never echoed to the client). Needs `cryptography` (target/egress-py).
"""
import datetime, http.server, ipaddress, json, ssl, sys
from cryptography import x509
from cryptography.x509.oid import NameOID, ExtendedKeyUsageOID
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

d, names = sys.argv[1], sys.argv[2].split(",")
now = datetime.datetime.now(datetime.timezone.utc)
def cert(subject, issuer, pub, key, ca, extra):
    b = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(pub)
         .serial_number(x509.random_serial_number())
         .not_valid_before(now - datetime.timedelta(hours=1))
         .not_valid_after(now + datetime.timedelta(days=1))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    for e in extra:
        b = b.add_extension(e, critical=False)
    return b.sign(key, hashes.SHA256())
ca_key = ec.generate_private_key(ec.SECP256R1())
ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "egress test CA")])
ca = cert(ca_name, ca_name, ca_key.public_key(), ca_key, True,
          [x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())])
key = ec.generate_private_key(ec.SECP256R1())
sans = [x509.DNSName(n) for n in names] + [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
leaf = cert(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]), ca_name,
            key.public_key(), ca_key, False,
            [x509.SubjectAlternativeName(sans),
             x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
             x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key())])
open(d + "/ca.pem", "wb").write(ca.public_bytes(serialization.Encoding.PEM))
open(d + "/leaf.pem", "wb").write(leaf.public_bytes(serialization.Encoding.PEM))
open(d + "/leaf.key", "wb").write(key.private_bytes(serialization.Encoding.PEM,
    serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))

ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(d + "/leaf.pem", d + "/leaf.key")
seen = {}
def sni(sock, name, _ctx):
    seen["sni"] = name
ctx.sni_callback = sni

class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a):
        pass
    def do_GET(self):
        with open(d + "/seen.jsonl", "a") as f:
            f.write(json.dumps({"path": self.path, "sni": seen.get("sni"),
                                "auth": self.headers.get_all("Authorization")}) + "\n")
        if self.path.startswith("/redirect?to="):
            self.send_response(302)
            self.send_header("Location", self.path.split("=", 1)[1])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path.startswith("/big"):
            n = int(self.path.split("=")[1])
            self.send_response(200)
            self.send_header("Content-Length", str(n))
            self.end_headers()
            chunk = b"x" * 65536
            try:
                while n > 0:
                    self.wfile.write(chunk[:min(n, len(chunk))])
                    n -= len(chunk)
            except OSError:
                pass
            return
        if self.path == "/x.csv":
            body = b"a,b\n1,2\n3,4\n"
        else:
            body = ("host=%s sni=%s" % (self.headers.get("Host"), seen.get("sni"))).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

class S(http.server.ThreadingHTTPServer):
    daemon_threads = True
    def finish_request(self, request, addr):
        request = ctx.wrap_socket(request, server_side=True)
        super().finish_request(request, addr)
    def handle_error(self, request, addr):
        pass

s = S(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
