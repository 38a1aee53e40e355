package server

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/auth"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/selector"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
	"github.com/jobfence/jobfence/store"
)

// Role is what a credential may do.
type Role string

// The roles of a credential.
const (
	RoleProducer Role = "producer" // EnqueueRefund, CancelRefund of its own enqueues
	RoleWorker   Role = "worker"   // Claim, Complete, Reschedule, Escalate, RenewLeases, ReportObservation, Work
	RoleOperator Role = "operator" // GetJob, ListJobs, GetOverview, GetActivity, ResolveReview, CancelRefund, pauses, attention
	RoleReader   Role = "reader"   // GetJob, ListJobs, GetOverview, GetActivity: sees, never acts (R29)
)

// methodRoles lists, per RPC, the roles any one of which allows it. Every
// role may ask WhoAmI.
var methodRoles = map[string][]Role{
	pb.Coordinator_EnqueueRefund_FullMethodName:        {RoleProducer},
	pb.Coordinator_Claim_FullMethodName:                {RoleWorker},
	pb.Coordinator_Complete_FullMethodName:             {RoleWorker},
	pb.Coordinator_Reschedule_FullMethodName:           {RoleWorker},
	pb.Coordinator_Escalate_FullMethodName:             {RoleWorker},
	pb.Coordinator_RenewLeases_FullMethodName:          {RoleWorker},
	pb.Coordinator_Work_FullMethodName:                 {RoleWorker},
	pb.Coordinator_ReportObservation_FullMethodName:    {RoleWorker},
	pb.Coordinator_GetJob_FullMethodName:               {RoleReader, RoleOperator},
	pb.Coordinator_ListJobs_FullMethodName:             {RoleReader, RoleOperator},
	pb.Coordinator_ResolveReview_FullMethodName:        {RoleOperator},
	pb.Coordinator_GetOverview_FullMethodName:          {RoleReader, RoleOperator},
	pb.Coordinator_GetActivity_FullMethodName:          {RoleReader, RoleOperator},
	pb.Coordinator_CancelRefund_FullMethodName:         {RoleOperator, RoleProducer},
	pb.Coordinator_PauseProvider_FullMethodName:        {RoleOperator},
	pb.Coordinator_ResumeProvider_FullMethodName:       {RoleOperator},
	pb.Coordinator_AcknowledgeAttention_FullMethodName: {RoleOperator},
	pb.Coordinator_WhoAmI_FullMethodName:               {RoleProducer, RoleWorker, RoleOperator, RoleReader},
}

// Identity is who made a call, from its credential.
type Identity struct {
	Name  string
	Roles []Role
}

type identityKey struct{}

// IdentityFrom returns the caller's identity; false when the coordinator
// runs open (loopback without credentials).
func IdentityFrom(ctx context.Context) (Identity, bool) {
	id, ok := ctx.Value(identityKey{}).(Identity)
	return id, ok
}

// Authenticator checks bearer tokens against their SHA-256 hashes, or, with
// mutual TLS and no tokens, accepts any verified client certificate with every
// role under its subject's common name.
type Authenticator struct {
	tokens map[[sha256.Size]byte]Identity
	mtls   bool
}

// LoadTokens reads a tokens file: one credential per line,
//
//	<name> <role>[,<role>…] sha256:<hex of the token's SHA-256>
//
// with '#' comments. Tokens are never stored, only their hashes; make one with
// `printf %s "$TOKEN" | sha256sum`.
func LoadTokens(path string) (*Authenticator, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	a := &Authenticator{tokens: map[[sha256.Size]byte]Identity{}}
	names := map[string]int{} // name → line
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = strings.TrimSpace(line[:i])
		}
		if line == "" {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 3 {
			return nil, fmt.Errorf("%s:%d: want <name> <roles> sha256:<hex>", path, n)
		}
		id := Identity{Name: fields[0]}
		// The name is the identity in histories and the worker_id of claims:
		// it must fit where they are kept.
		if len(id.Name) > store.MaxKeyLen {
			return nil, fmt.Errorf("%s:%d: the name is %d bytes, at most %d", path, n, len(id.Name), store.MaxKeyLen)
		}
		if first, dup := names[id.Name]; dup {
			return nil, fmt.Errorf("%s:%d: the name %q is already on line %d: give each credential its own", path, n,
				id.Name, first)
		}
		names[id.Name] = n
		for _, r := range strings.Split(fields[1], ",") {
			role := Role(r)
			if role != RoleProducer && role != RoleWorker && role != RoleOperator && role != RoleReader {
				return nil, fmt.Errorf("%s:%d: unknown role %q (producer, worker, operator, reader)", path, n, r)
			}
			id.Roles = append(id.Roles, role)
		}
		hexSum, ok := strings.CutPrefix(fields[2], "sha256:")
		sum, err := hex.DecodeString(hexSum)
		if !ok || err != nil || len(sum) != sha256.Size {
			return nil, fmt.Errorf("%s:%d: the hash must be sha256:<64 hex digits>", path, n)
		}
		var key [sha256.Size]byte
		copy(key[:], sum)
		if key == sha256.Sum256(nil) {
			return nil, fmt.Errorf("%s:%d: that is the hash of the empty token, which any caller without one "+
				"could send: hash the token itself (printf %%s \"$TOKEN\" | sha256sum)", path, n)
		}
		if _, dup := a.tokens[key]; dup {
			return nil, fmt.Errorf("%s:%d: the same token hash appears twice", path, n)
		}
		a.tokens[key] = id
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(a.tokens) == 0 {
		return nil, fmt.Errorf("%s: no credentials", path)
	}
	return a, nil
}

// MutualTLS returns an Authenticator that trusts verified client
// certificates: the certificate's common name is the identity, with every
// role.
func MutualTLS() *Authenticator { return &Authenticator{mtls: true} }

// authenticated selects every call but health checks and reflection.
var authenticated = selector.MatchFunc(func(_ context.Context, c interceptors.CallMeta) bool {
	return c.Service != healthpb.Health_ServiceDesc.ServiceName && !strings.HasPrefix(c.Service, "grpc.reflection.")
})

// interceptor authenticates every call except health checks and reflection,
// and authorises it by role.
func (a *Authenticator) interceptor() grpc.UnaryServerInterceptor {
	return selector.UnaryServerInterceptor(auth.UnaryServerInterceptor(a.authenticate), authenticated)
}

// streamInterceptor is interceptor for streams (the worker stream).
func (a *Authenticator) streamInterceptor() grpc.StreamServerInterceptor {
	return selector.StreamServerInterceptor(auth.StreamServerInterceptor(a.authenticate), authenticated)
}

func (a *Authenticator) authenticate(ctx context.Context) (context.Context, error) {
	id, err := a.identify(ctx)
	if err != nil {
		return nil, err
	}
	method, _ := grpc.Method(ctx)
	allowed, known := methodRoles[method]
	if !known || !slices.ContainsFunc(id.Roles, func(r Role) bool { return slices.Contains(allowed, r) }) {
		return nil, withDetails(codes.PermissionDenied,
			fmt.Sprintf("%s may not call %s (needs one of %v)", id.Name, method, allowed), info(ReasonPermissionDenied, nil)).Err()
	}
	return context.WithValue(ctx, identityKey{}, id), nil
}

// missingToken is the answer to a call without a bearer token when the
// coordinator has a tokens file: what to send, and where each client sends
// it from.
const missingToken = `missing bearer token: send the metadata header "authorization: Bearer <token>" with every ` +
	`call (Go SDK: WithBearerToken; TypeScript and Python SDKs: the token option; refundworker and the example ` +
	`workers: --token-file <file holding the token>; grpcurl: -H 'authorization: Bearer <token>'). The ` +
	`coordinator's --tokens-file holds the token's SHA-256`

func (a *Authenticator) identify(ctx context.Context) (Identity, error) {
	if a.tokens != nil {
		token, err := auth.AuthFromMD(ctx, "bearer")
		if err != nil {
			return Identity{}, withDetails(codes.Unauthenticated, missingToken, info(ReasonUnauthenticated, nil)).Err()
		}
		if id, ok := a.tokens[sha256.Sum256([]byte(token))]; ok {
			return id, nil
		}
		return Identity{}, withDetails(codes.Unauthenticated, "unknown bearer token", info(ReasonUnauthenticated, nil)).Err()
	}
	if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.VerifiedChains) > 0 {
			cert := ti.State.VerifiedChains[0][0]
			return Identity{Name: commonName(cert), Roles: []Role{RoleProducer, RoleWorker, RoleOperator, RoleReader}}, nil
		}
	}
	return Identity{}, withDetails(codes.Unauthenticated, "a verified client certificate is required",
		info(ReasonUnauthenticated, nil)).Err()
}

func commonName(c *x509.Certificate) string {
	if c.Subject.CommonName != "" {
		return c.Subject.CommonName
	}
	return c.Subject.String()
}
