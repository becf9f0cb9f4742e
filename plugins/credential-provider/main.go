// mirrorgate-credential-provider is a kubelet image credential provider
// (credentialprovider.kubelet.k8s.io/v1) that asks mirrorgate for the mirror
// login of the Pod being started.
//
// The kubelet runs it once per pull it has no cached answer for, with a
// CredentialProviderRequest on stdin that carries a service-account token
// bound to that Pod (the provider's tokenAttributes). The plugin sends the
// image and the token to mirrorgate's credential endpoint over HTTPS, trusting
// only mirrorgate's CA and presenting the kubelet's own client certificate, so
// that mirrorgate can check that the caller is the kubelet of the Pod's node.
// It prints mirrorgate's CredentialProviderResponse on stdout, or exits 1 with
// one line on stderr.
//
// The rule it keeps: a login is held in memory only, between mirrorgate's
// answer and stdout. Nothing is written to disk, and no message names a
// username, a password or the token.
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

const (
	apiVersion   = "credentialprovider.kubelet.k8s.io/v1"
	requestKind  = "CredentialProviderRequest"
	responseKind = "CredentialProviderResponse"

	// MaxRequestBytes bounds what is read from stdin: a request is an image
	// reference, a token and a few annotations.
	MaxRequestBytes = 1 << 20
	// MaxAnswerBytes bounds what is read of mirrorgate's answer: one login.
	MaxAnswerBytes = 64 << 10
	// maxMessage bounds the one stderr line.
	maxMessage = 512

	defaultClientCert = "/var/lib/kubelet/pki/kubelet-client-current.pem"
)

// Request is the part of a CredentialProviderRequest the plugin reads.
type Request struct {
	APIVersion                string            `json:"apiVersion"`
	Kind                      string            `json:"kind"`
	Image                     string            `json:"image"`
	ServiceAccountToken       string            `json:"serviceAccountToken,omitempty"`
	ServiceAccountAnnotations map[string]string `json:"serviceAccountAnnotations,omitempty"`
}

// AuthConfig is one login of a CredentialProviderResponse.
type AuthConfig struct {
	Username string `json:"username"`
	Password string `json:"password"`
}

// GoString keeps the password out of %#v.
func (a AuthConfig) GoString() string { return fmt.Sprintf("AuthConfig{Username: %q}", a.Username) }

// String keeps the password out of %v and %s.
func (a AuthConfig) String() string { return a.GoString() }

// Response is a CredentialProviderResponse: what mirrorgate answers and the
// plugin prints, once checked.
type Response struct {
	APIVersion    string                `json:"apiVersion"`
	Kind          string                `json:"kind"`
	CacheKeyType  string                `json:"cacheKeyType"`
	CacheDuration string                `json:"cacheDuration,omitempty"`
	Auth          map[string]AuthConfig `json:"auth"`
}

// refusal is mirrorgate's answer when it gives no login.
type refusal struct {
	Error  string `json:"error"`
	Reason string `json:"reason"`
}

type config struct {
	url            string
	caFile         string
	clientCert     string
	clientKey      string
	connectTimeout time.Duration
	timeout        time.Duration
}

func parseConfig(args []string, getenv func(string) string) (config, error) {
	orEnv := func(name, fallback string) string {
		if value := getenv(name); value != "" {
			return value
		}
		return fallback
	}
	var cfg config
	flags := flag.NewFlagSet("mirrorgate-credential-provider", flag.ContinueOnError)
	flags.SetOutput(io.Discard)
	flags.StringVar(&cfg.url, "url", orEnv("MIRRORGATE_URL", ""),
		"mirrorgate's credential endpoint, https://HOST:PORT/kubelet-credentials ($MIRRORGATE_URL)")
	flags.StringVar(&cfg.caFile, "ca-file", orEnv("MIRRORGATE_CA_FILE", ""),
		"the CA (PEM) that signs mirrorgate's serving certificate ($MIRRORGATE_CA_FILE)")
	flags.StringVar(&cfg.clientCert, "client-cert", orEnv("MIRRORGATE_CLIENT_CERT", defaultClientCert),
		"the kubelet's client certificate (PEM) ($MIRRORGATE_CLIENT_CERT)")
	flags.StringVar(&cfg.clientKey, "client-key", orEnv("MIRRORGATE_CLIENT_KEY", ""),
		"its key (PEM; default: the certificate's file, as the kubelet keeps them) ($MIRRORGATE_CLIENT_KEY)")
	flags.DurationVar(&cfg.connectTimeout, "connect-timeout", 2*time.Second,
		"longest time to connect and complete the TLS handshake")
	flags.DurationVar(&cfg.timeout, "timeout", 5*time.Second,
		"longest time for the whole exchange with mirrorgate")
	if err := flags.Parse(args); err != nil {
		return cfg, fmt.Errorf("bad arguments: %v", err)
	}
	if flags.NArg() > 0 {
		return cfg, fmt.Errorf("bad arguments: unexpected %q", flags.Arg(0))
	}
	if cfg.clientKey == "" {
		cfg.clientKey = cfg.clientCert
	}
	parsed, err := url.Parse(cfg.url)
	switch {
	case cfg.url == "":
		return cfg, errors.New("no --url (or $MIRRORGATE_URL): mirrorgate's credential endpoint")
	case err != nil || parsed.Scheme != "https" || parsed.Host == "":
		return cfg, fmt.Errorf("--url %q is not an https:// URL", cfg.url)
	case cfg.caFile == "":
		return cfg, errors.New("no --ca-file (or $MIRRORGATE_CA_FILE): the CA of mirrorgate's serving certificate")
	case cfg.connectTimeout <= 0 || cfg.timeout <= 0:
		return cfg, errors.New("--connect-timeout and --timeout must be positive")
	}
	return cfg, nil
}

func readRequest(stdin io.Reader) (Request, error) {
	var req Request
	data, err := io.ReadAll(io.LimitReader(stdin, MaxRequestBytes+1))
	if err != nil {
		return req, fmt.Errorf("cannot read the request from stdin: %v", err)
	}
	if len(data) > MaxRequestBytes {
		return req, fmt.Errorf("the request on stdin exceeds %d bytes", MaxRequestBytes)
	}
	if err := json.Unmarshal(data, &req); err != nil {
		return req, errors.New("the request on stdin is not a JSON CredentialProviderRequest")
	}
	switch {
	case req.APIVersion != apiVersion || req.Kind != requestKind:
		return req, fmt.Errorf("the request is %s %s, not %s %s (the CredentialProviderConfig's apiVersion)",
			quoted(req.APIVersion), quoted(req.Kind), apiVersion, requestKind)
	case req.Image == "":
		return req, errors.New("the request names no image")
	case req.ServiceAccountToken == "":
		return req, errors.New("the request carries no serviceAccountToken: the provider's " +
			"CredentialProviderConfig entry needs tokenAttributes (serviceAccountTokenAudience)")
	}
	return req, nil
}

func client(cfg config) (*http.Client, error) {
	caPEM, err := os.ReadFile(cfg.caFile)
	if err != nil {
		return nil, fmt.Errorf("--ca-file: %v", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("--ca-file %s holds no PEM certificate", cfg.caFile)
	}
	pair, err := tls.LoadX509KeyPair(cfg.clientCert, cfg.clientKey)
	if err != nil {
		return nil, fmt.Errorf("the kubelet's client certificate %s: %v", cfg.clientCert, err)
	}
	dialer := &net.Dialer{Timeout: cfg.connectTimeout}
	transport := &http.Transport{
		// The token goes to mirrorgate and nowhere else: no proxy from the kubelet's environment.
		Proxy:       nil,
		DialContext: dialer.DialContext,
		TLSClientConfig: &tls.Config{
			RootCAs:      roots,
			Certificates: []tls.Certificate{pair},
			MinVersion:   tls.VersionTLS12,
		},
		TLSHandshakeTimeout:    cfg.connectTimeout,
		ResponseHeaderTimeout:  cfg.timeout,
		MaxResponseHeaderBytes: 16 << 10,
		DisableKeepAlives:      true,
	}
	return &http.Client{
		Transport: transport,
		Timeout:   cfg.timeout,
		// A redirect would take the token elsewhere.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}, nil
}

func ask(ctx context.Context, cfg config, req Request) (Response, error) {
	var answer Response
	httpClient, err := client(cfg)
	if err != nil {
		return answer, err
	}
	// mirrorgate reads the kubelet's request as it is.
	body, err := json.Marshal(req)
	if err != nil {
		return answer, errors.New("cannot encode the request")
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	post, err := http.NewRequestWithContext(ctx, http.MethodPost, cfg.url, bytes.NewReader(body))
	if err != nil {
		return answer, fmt.Errorf("--url %q: %v", cfg.url, err)
	}
	post.Header.Set("Content-Type", "application/json")
	post.Header.Set("Accept", "application/json")
	resp, err := httpClient.Do(post)
	if err != nil {
		// url.Error names the method and URL, never the body (the token).
		return answer, fmt.Errorf("cannot reach mirrorgate: %v", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, MaxAnswerBytes+1))
	if err != nil {
		return answer, fmt.Errorf("mirrorgate's answer could not be read: %v", err)
	}
	if len(data) > MaxAnswerBytes {
		return answer, fmt.Errorf("mirrorgate's answer exceeds %d bytes", MaxAnswerBytes)
	}
	if resp.StatusCode != http.StatusOK {
		var refused refusal
		if json.Unmarshal(data, &refused) == nil && refused.Error != "" {
			return answer, fmt.Errorf("mirrorgate gives no login for %s (HTTP %d, %s): %s",
				req.Image, resp.StatusCode, quoted(refused.Reason), refused.Error)
		}
		return answer, fmt.Errorf("mirrorgate gives no login for %s (HTTP %d)", req.Image, resp.StatusCode)
	}
	if err := json.Unmarshal(data, &answer); err != nil {
		return answer, errors.New("mirrorgate's answer is not a JSON CredentialProviderResponse")
	}
	return answer, check(answer)
}

// check says what is wrong with an answer, naming fields, never their values.
func check(answer Response) error {
	if answer.APIVersion != apiVersion || answer.Kind != responseKind {
		return fmt.Errorf("mirrorgate's answer is not a %s %s", apiVersion, responseKind)
	}
	switch answer.CacheKeyType {
	case "Image", "Registry", "Global":
	default:
		return fmt.Errorf("mirrorgate's answer has cacheKeyType %s: not Image, Registry or Global",
			quoted(answer.CacheKeyType))
	}
	if answer.CacheDuration != "" {
		if d, err := time.ParseDuration(answer.CacheDuration); err != nil || d < 0 {
			return fmt.Errorf("mirrorgate's answer has cacheDuration %s: not a duration",
				quoted(answer.CacheDuration))
		}
	}
	if len(answer.Auth) == 0 {
		return errors.New("mirrorgate's answer holds no login")
	}
	for key, login := range answer.Auth {
		if key == "" || login.Username == "" || login.Password == "" {
			return errors.New("mirrorgate's answer holds a login without a registry, username or password")
		}
	}
	return nil
}

func quoted(text string) string {
	if len(text) > 64 {
		text = text[:64] + "..."
	}
	return fmt.Sprintf("%q", text)
}

// oneLine is the stderr line the kubelet logs: one line, bounded.
func oneLine(err error) string {
	text := strings.Join(strings.Fields(err.Error()), " ")
	if len(text) > maxMessage {
		text = text[:maxMessage] + "..."
	}
	return "mirrorgate-credential-provider: " + text + "\n"
}

func run(args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) int {
	fail := func(err error) int {
		_, _ = io.WriteString(stderr, oneLine(err))
		return 1
	}
	cfg, err := parseConfig(args, getenv)
	if err != nil {
		return fail(err)
	}
	req, err := readRequest(stdin)
	if err != nil {
		return fail(err)
	}
	answer, err := ask(context.Background(), cfg, req)
	if err != nil {
		return fail(err)
	}
	if err := json.NewEncoder(stdout).Encode(answer); err != nil {
		return fail(fmt.Errorf("cannot write the response: %v", err))
	}
	return 0
}

func main() {
	os.Exit(run(os.Args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr))
}
