package main

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const (
	token    = "eyJhbGciOiJFUzI1NiJ9.the-pod-token.signature"
	password = "s3cret-password-of-the-mirror"
	image    = "mirror.example/library/nginx:1.27"
)

// kubeletCert writes a self-signed client certificate and its key into one
// file, as the kubelet keeps kubelet-client-current.pem; returns the file and
// the certificate.
func kubeletCert(t *testing.T, dir, name string) (string, *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	template := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: name, Organization: []string{"system:nodes"}},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		IsCA:         true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, template, template, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	keyDER, _ := x509.MarshalECPrivateKey(key)
	var out bytes.Buffer
	_ = pem.Encode(&out, &pem.Block{Type: "CERTIFICATE", Bytes: der})
	_ = pem.Encode(&out, &pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	path := filepath.Join(dir, name+".pem")
	if err := os.WriteFile(path, out.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return path, cert
}

type fixture struct {
	server   *httptest.Server
	caFile   string
	certFile string
	seen     chan seen
}

type seen struct {
	request Request
	peer    string
}

// mirrorgate is a TLS server that requires the kubelet's certificate and
// answers with handler.
func mirrorgate(t *testing.T, handler func(w http.ResponseWriter, r *http.Request, req Request)) *fixture {
	t.Helper()
	dir := t.TempDir()
	certFile, cert := kubeletCert(t, dir, "system:node:node-a")
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	f := &fixture{certFile: certFile, seen: make(chan seen, 4)}
	f.server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req Request
		_ = json.NewDecoder(r.Body).Decode(&req)
		f.seen <- seen{req, r.TLS.PeerCertificates[0].Subject.CommonName}
		handler(w, r, req)
	}))
	f.server.TLS = &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool}
	f.server.StartTLS()
	t.Cleanup(f.server.Close)
	f.caFile = filepath.Join(dir, "ca.crt")
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: f.server.Certificate().Raw})
	if err := os.WriteFile(f.caFile, caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fixture) args(extra ...string) []string {
	return append([]string{
		"--url=" + f.server.URL + "/kubelet-credentials", "--ca-file=" + f.caFile,
		"--client-cert=" + f.certFile,
	}, extra...)
}

func requestJSON() string {
	return `{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderRequest",` +
		`"image":"` + image + `","serviceAccountToken":"` + token + `",` +
		`"serviceAccountAnnotations":{"example.com/team":"a"}}`
}

func invoke(args []string, stdin string) (int, string, string) {
	var stdout, stderr bytes.Buffer
	code := run(args, func(string) string { return "" }, strings.NewReader(stdin), &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func granted(w http.ResponseWriter, _ *http.Request, _ Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"apiVersion":"credentialprovider.kubelet.k8s.io/v1",`+
		`"kind":"CredentialProviderResponse","cacheKeyType":"Image","cacheDuration":"5m0s",`+
		`"auth":{"mirror.example/library/nginx":{"username":"robot","password":"`+password+`"}}}`)
}

// assertFailed: exit 1, nothing on stdout, one line on stderr holding want
// and neither the token nor the password.
func assertFailed(t *testing.T, code int, stdout, stderr, want string) {
	t.Helper()
	if code != 1 || stdout != "" {
		t.Fatalf("exit %d, stdout %q; want 1 and nothing", code, stdout)
	}
	if strings.Count(stderr, "\n") != 1 || !strings.HasSuffix(stderr, "\n") {
		t.Fatalf("stderr is not one line: %q", stderr)
	}
	if !strings.Contains(stderr, want) {
		t.Fatalf("stderr %q does not say %q", stderr, want)
	}
	if strings.Contains(stderr, token) || strings.Contains(stderr, password) {
		t.Fatalf("stderr leaks a secret: %q", stderr)
	}
}

func TestAnswersWithTheLoginAndForwardsTheRequest(t *testing.T) {
	f := mirrorgate(t, granted)
	code, stdout, stderr := invoke(f.args(), requestJSON())
	if code != 0 || stderr != "" {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	var printed Response
	if err := json.Unmarshal([]byte(stdout), &printed); err != nil {
		t.Fatalf("stdout is not JSON: %v", err)
	}
	if printed.Kind != responseKind || printed.APIVersion != apiVersion ||
		printed.CacheKeyType != "Image" || printed.CacheDuration != "5m0s" {
		t.Fatalf("printed %+v", printed)
	}
	if printed.Auth["mirror.example/library/nginx"].Password != password {
		t.Fatalf("printed no login: %+v", printed.Auth)
	}
	got := <-f.seen
	if got.request.ServiceAccountToken != token || got.request.Image != image ||
		got.request.ServiceAccountAnnotations["example.com/team"] != "a" {
		t.Fatalf("mirrorgate was sent %+v", got.request)
	}
	if got.peer != "system:node:node-a" {
		t.Fatalf("mirrorgate saw peer %q, not the kubelet's certificate", got.peer)
	}
}

func TestRefusalIsOneLineNamingTheReason(t *testing.T) {
	f := mirrorgate(t, func(w http.ResponseWriter, _ *http.Request, _ Request) {
		w.WriteHeader(http.StatusForbidden)
		_, _ = io.WriteString(w, `{"error":"credential 'corp' is not granted to namespace 'b'\nsecond line","reason":"not-granted"}`)
	})
	code, stdout, stderr := invoke(f.args(), requestJSON())
	assertFailed(t, code, stdout, stderr, `HTTP 403, "not-granted"): credential 'corp' is not granted to namespace 'b' second line`)
}

func TestAMalformedAnswerNamesNoValue(t *testing.T) {
	for name, body := range map[string]string{
		"no password": `{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderResponse",` +
			`"cacheKeyType":"Image","auth":{"mirror.example":{"username":"` + password + `","password":""}}}`,
		"bad key type": `{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderResponse",` +
			`"cacheKeyType":"Pod","auth":{"mirror.example":{"username":"u","password":"` + password + `"}}}`,
		"not json": `{"auth": "` + password,
	} {
		t.Run(name, func(t *testing.T) {
			f := mirrorgate(t, func(w http.ResponseWriter, _ *http.Request, _ Request) {
				_, _ = io.WriteString(w, body)
			})
			code, stdout, stderr := invoke(f.args(), requestJSON())
			assertFailed(t, code, stdout, stderr, "mirrorgate's answer")
		})
	}
}

func TestTheAnswerIsBounded(t *testing.T) {
	f := mirrorgate(t, func(w http.ResponseWriter, _ *http.Request, _ Request) {
		_, _ = w.Write(bytes.Repeat([]byte(" "), MaxAnswerBytes+1))
	})
	code, stdout, stderr := invoke(f.args(), requestJSON())
	assertFailed(t, code, stdout, stderr, "exceeds 65536 bytes")
}

func TestTheExchangeIsBoundedInTime(t *testing.T) {
	release := make(chan struct{})
	f := mirrorgate(t, func(http.ResponseWriter, *http.Request, Request) { <-release })
	defer close(release)
	started := time.Now()
	code, stdout, stderr := invoke(f.args("--timeout=300ms"), requestJSON())
	if elapsed := time.Since(started); elapsed > 3*time.Second {
		t.Fatalf("took %v with a 300ms timeout", elapsed)
	}
	assertFailed(t, code, stdout, stderr, "cannot reach mirrorgate")
}

func TestAHandshakeThatNeverCompletesIsBoundedByTheConnectTimeout(t *testing.T) {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close()
	go func() { // accepts, then never answers the ClientHello
		for {
			conn, err := listener.Accept()
			if err != nil {
				return
			}
			defer conn.Close()
		}
	}()
	f := mirrorgate(t, granted)
	args := []string{"--url=https://" + listener.Addr().String() + "/kubelet-credentials",
		"--ca-file=" + f.caFile, "--client-cert=" + f.certFile, "--connect-timeout=200ms", "--timeout=20s"}
	started := time.Now()
	code, stdout, stderr := invoke(args, requestJSON())
	if elapsed := time.Since(started); elapsed > 3*time.Second {
		t.Fatalf("took %v with a 200ms connect timeout", elapsed)
	}
	assertFailed(t, code, stdout, stderr, "handshake timeout")
}

func TestAServerOutsideTheCAIsRefused(t *testing.T) {
	f := mirrorgate(t, granted)
	otherCA, _ := kubeletCert(t, t.TempDir(), "another CA")
	args := []string{"--url=" + f.server.URL + "/kubelet-credentials", "--ca-file=" + otherCA,
		"--client-cert=" + f.certFile}
	code, stdout, stderr := invoke(args, requestJSON())
	assertFailed(t, code, stdout, stderr, "certificate")
	if len(f.seen) != 0 {
		t.Fatal("the token reached a server the CA does not vouch for")
	}
}

func TestBadRequestsAreRefusedBeforeAnyCall(t *testing.T) {
	f := mirrorgate(t, granted)
	cases := map[string]struct{ stdin, want string }{
		"not json":      {"{", "not a JSON CredentialProviderRequest"},
		"other version": {strings.Replace(requestJSON(), "/v1", "/v1beta1", 1), `not credentialprovider.kubelet.k8s.io/v1`},
		"no token":      {strings.Replace(requestJSON(), token, "", 1), "needs tokenAttributes"},
		"no image":      {strings.Replace(requestJSON(), image, "", 1), "names no image"},
		"too large":     {strings.Repeat(" ", MaxRequestBytes+1), "exceeds 1048576 bytes"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			code, stdout, stderr := invoke(f.args(), c.stdin)
			assertFailed(t, code, stdout, stderr, c.want)
		})
	}
	if len(f.seen) != 0 {
		t.Fatal("a bad request reached mirrorgate")
	}
}

func TestBadArguments(t *testing.T) {
	cases := map[string]struct {
		args []string
		want string
	}{
		"no url":     {[]string{"--ca-file=x"}, "no --url"},
		"plain http": {[]string{"--url=http://h/x", "--ca-file=x"}, "is not an https:// URL"},
		"no ca":      {[]string{"--url=https://h/x"}, "no --ca-file"},
		"unknown":    {[]string{"--nope"}, "bad arguments"},
		"missing ca": {[]string{"--url=https://h/x", "--ca-file=/nonexistent/ca.crt"}, "--ca-file: open /nonexistent/ca.crt"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			code, stdout, stderr := invoke(c.args, requestJSON())
			assertFailed(t, code, stdout, stderr, c.want)
		})
	}
}

func TestTheEnvironmentGivesTheSettings(t *testing.T) {
	f := mirrorgate(t, granted)
	env := map[string]string{
		"MIRRORGATE_URL":         f.server.URL + "/kubelet-credentials",
		"MIRRORGATE_CA_FILE":     f.caFile,
		"MIRRORGATE_CLIENT_CERT": f.certFile,
	}
	var stdout, stderr bytes.Buffer
	code := run(nil, func(k string) string { return env[k] }, strings.NewReader(requestJSON()), &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
}

func TestALoginPrintsNoPassword(t *testing.T) {
	login := AuthConfig{Username: "robot", Password: password}
	for _, shown := range []string{
		strings.Join([]string{login.String(), login.GoString()}, " "),
	} {
		if strings.Contains(shown, password) {
			t.Fatalf("%q shows the password", shown)
		}
	}
}
