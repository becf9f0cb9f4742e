// test-credential-provider: a kubelet credential-provider exec plugin for the tests.
//
// It speaks credentialprovider.kubelet.k8s.io/v1 exactly as ecr-credential-provider
// does: a CredentialProviderRequest on stdin, a CredentialProviderResponse on stdout.
// The login it returns is a short-lived robot password minted by the e2e token
// server (GET $TOKEN_URL?ttl=N with the robot's own secret), so an expired login
// is refused by the registry for real.
//
// Flags select the response's cacheKeyType, cacheDuration, apiVersion and auth
// key, and the faults the tests need: exit non-zero, hang, answer malformed JSON,
// write without end, and echo the password on stderr (which mirrorgate must
// redact). With --fault-file, a test switches faults on and off while mirrorgate
// keeps running the plugin.
//
// To check that nothing a plugin prints leaks from mirrorgate when its answer is
// refused: --echo-secret writes the password, its base64 user:password and the
// whole response to stderr; --password-suffix gives the password characters that
// JSON escapes; --kind, --exit-status and --after (hang, flood, garbage or deep, once
// the response is written) make the answer fail in each way (deep: lists
// nested 5,000 deep); --decoys writes that many other logins ahead of the real
// one; --spawn-setsid leaves a child in a session of its own holding the pipes.
//
// To check what a plugin can see of mirrorgate's identity: --report writes one
// line to stderr, "report: env=NAMES token=STATE", the sorted names of its
// environment and whether the file --report-token names (by default the
// ServiceAccount token's path) is readable, absent or unreadable.
package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"sort"
	"strings"
	"syscall"
	"time"
)

type request struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Image      string `json:"image"`
}

type authConfig struct {
	Username string `json:"username"`
	Password string `json:"password"`
}

type response struct {
	APIVersion    string                `json:"apiVersion"`
	Kind          string                `json:"kind"`
	CacheKeyType  string                `json:"cacheKeyType"`
	CacheDuration string                `json:"cacheDuration,omitempty"`
	Auth          map[string]authConfig `json:"auth"`
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "test-credential-provider: "+format+"\n", args...)
	os.Exit(1)
}

func mint(ttl int) (string, error) {
	pool := x509.NewCertPool()
	pem, err := os.ReadFile(os.Getenv("CA_FILE"))
	if err != nil {
		return "", err
	}
	pool.AppendCertsFromPEM(pem)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	req, err := http.NewRequest("GET", os.Getenv("TOKEN_URL")+"?ttl="+url.QueryEscape(fmt.Sprint(ttl)), nil)
	if err != nil {
		return "", err
	}
	req.SetBasicAuth(os.Getenv("ROBOT"), os.Getenv("ROBOT_SECRET"))
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode != 200 {
		return "", fmt.Errorf("token server answered %d", resp.StatusCode)
	}
	var minted struct {
		Password string `json:"password"`
	}
	if err := json.Unmarshal(body, &minted); err != nil || minted.Password == "" {
		return "", fmt.Errorf("token server answered no password")
	}
	return minted.Password, nil
}

func main() {
	ttl := flag.Int("ttl", 60, "lifetime of the minted password, seconds")
	keyType := flag.String("cache-key-type", "Registry", "Image, Registry or Global")
	duration := flag.String("cache-duration", "", "cacheDuration of the response (default: none)")
	authKey := flag.String("auth-key", "", "the auth key (default: the image's registry host)")
	apiVersion := flag.String("api-version", "", "the response's apiVersion (default: the request's)")
	fault := flag.String("fault", "", "exit, hang, malformed, flood or echo")
	faultFile := flag.String("fault-file", "", "a file whose content, while it exists, is the fault")
	echoSecret := flag.Bool("echo-secret", false, "write the password, its auth and the response to stderr")
	suffix := flag.String("password-suffix", "", "appended to the minted password")
	kind := flag.String("kind", "CredentialProviderResponse", "the response's kind")
	exitStatus := flag.Int("exit-status", 0, "exit status after writing the response")
	after := flag.String("after", "", "after writing the response: hang, flood, garbage or deep")
	decoys := flag.Int("decoys", 0, "auth entries, each with a password of its own, ahead of the real one")
	spawnSetsid := flag.String("spawn-setsid", "", "start a child in its own session holding the pipes; its pid goes to this file")
	report := flag.Bool("report", false, "write the environment's names and the token file's state to stderr")
	reportToken := flag.String("report-token", "/var/run/secrets/kubernetes.io/serviceaccount/token", "the token file --report looks at")
	flag.Parse()
	if *report {
		names := []string{}
		for _, entry := range os.Environ() {
			names = append(names, strings.SplitN(entry, "=", 2)[0])
		}
		sort.Strings(names)
		state := "readable"
		if _, err := os.ReadFile(*reportToken); os.IsNotExist(err) {
			state = "absent"
		} else if err != nil {
			state = "unreadable"
		}
		fmt.Fprintf(os.Stderr, "report: env=%s token=%s\n", strings.Join(names, ","), state)
	}
	if *faultFile != "" {
		if content, err := os.ReadFile(*faultFile); err == nil {
			*fault = strings.TrimSpace(string(content))
		}
	}

	var req request
	if err := json.NewDecoder(io.LimitReader(os.Stdin, 1<<20)).Decode(&req); err != nil {
		fail("reading the request: %v", err)
	}
	if req.Kind != "CredentialProviderRequest" || req.Image == "" {
		fail("not a CredentialProviderRequest with an image")
	}
	switch *fault {
	case "exit":
		fail("refusing on purpose")
	case "hang":
		fmt.Fprintln(os.Stderr, "test-credential-provider: hanging on purpose")
		time.Sleep(time.Hour)
	case "flood":
		// Without end: only mirrorgate's limits stop it.
		line := strings.Repeat("x", 1023) + "\n"
		for {
			fmt.Fprint(os.Stderr, line)
			fmt.Print(line)
		}
	case "malformed":
		fmt.Print(`{"apiVersion": "` + req.APIVersion + `", "kind": "CredentialProviderResponse", "auth": `)
		return
	}
	if *spawnSetsid != "" {
		child := exec.Command("sleep", "3600")
		child.Stdout, child.Stderr = os.Stdout, os.Stderr
		child.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := child.Start(); err != nil {
			fail("starting a child: %v", err)
		}
		if err := os.WriteFile(*spawnSetsid, []byte(fmt.Sprint(child.Process.Pid)), 0o600); err != nil {
			fail("writing the child's pid: %v", err)
		}
	}
	password, err := mint(*ttl)
	if err != nil {
		fail("minting a password: %v", err)
	}
	password += *suffix
	if *fault == "echo" {
		fmt.Fprintf(os.Stderr, "debug: minted password %s for %s\n", password, os.Getenv("ROBOT"))
	}
	key := *authKey
	if key == "" {
		key = strings.SplitN(req.Image, "/", 2)[0]
	}
	if *apiVersion == "" {
		*apiVersion = req.APIVersion
	}
	out := response{APIVersion: *apiVersion, Kind: *kind,
		CacheKeyType: *keyType, CacheDuration: *duration,
		Auth: map[string]authConfig{key: {Username: os.Getenv("ROBOT"), Password: password}}}
	for i := 0; i < *decoys; i++ {
		// Digits sort before letters: encoding/json writes these ahead of the real entry.
		out.Auth[fmt.Sprintf("%04d.decoy.example", i)] = authConfig{
			Username: fmt.Sprintf("decoy-%d", i), Password: fmt.Sprintf("decoy-password-%d", i)}
	}
	var encoded bytes.Buffer
	if err := json.NewEncoder(&encoded).Encode(out); err != nil {
		fail("encoding the response: %v", err)
	}
	if *echoSecret {
		auth := base64.StdEncoding.EncodeToString([]byte(os.Getenv("ROBOT") + ":" + password))
		fmt.Fprintf(os.Stderr, "debug: password %s\ndebug: auth %s\ndebug: response %s",
			password, auth, encoded.String())
	}
	if _, err := os.Stdout.Write(encoded.Bytes()); err != nil {
		fail("writing the response: %v", err)
	}
	switch *after {
	case "hang":
		time.Sleep(time.Hour)
	case "flood":
		line := strings.Repeat("x", 1023) + "\n"
		for {
			fmt.Print(line)
		}
	case "garbage":
		fmt.Print("}")
	case "deep":
		fmt.Print(strings.Repeat("[", 5000) + strings.Repeat("]", 5000))
	}
	os.Exit(*exitStatus)
}
