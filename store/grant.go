package store

import (
	"crypto/rand"
	"crypto/sha256"
	"database/sql/driver"
	"encoding/base64"
	"encoding/hex"
	"fmt"
)

// LeaseToken is the secret of one grant (R25): minted from crypto/rand by the
// claim or takeover that grants a job, handed only to its claimer, and
// required, with the attempt, by every write-back of that grant. The attempt
// is the human-readable generation (R2, R3) and is disclosed in errors and
// logs; the token is what proves the writer holds the grant, so knowing the
// attempt never lets anyone write. The empty token is "no token": a grant
// made before tokens existed.
type LeaseToken string

// leaseTokenBytes is the token's entropy: 128 bits (R25).
const leaseTokenBytes = 16

// MaxLeaseTokenLen bounds a lease token on input: a token this coordinator
// minted is 22 characters.
const MaxLeaseTokenLen = 64

// NewLeaseToken mints a token: 16 bytes from crypto/rand, unpadded base64url
// (22 characters, safe in JSON, headers and logs of a proxy that strips
// nothing).
func NewLeaseToken() LeaseToken {
	var b [leaseTokenBytes]byte
	rand.Read(b[:]) // never fails (crypto/rand.Read panics rather than return an error)
	return LeaseToken(base64.RawURLEncoding.EncodeToString(b[:]))
}

// Hash is what the database keeps of the token: its SHA-256, so that whoever
// reads the tables (a replica, a backup, a console) still cannot write. The
// empty token hashes to the zero TokenHash.
func (t LeaseToken) Hash() TokenHash {
	if t == "" {
		return TokenHash{}
	}
	return TokenHash(sha256.Sum256([]byte(t)))
}

// TokenHash is the SHA-256 of a grant's lease token as stored beside the
// attempt (R25); the zero value stands for a grant without a token.
type TokenHash [sha256.Size]byte

// IsZero reports a grant made without a token.
func (h TokenHash) IsZero() bool { return h == TokenHash{} }

// Fingerprint is a short, non-secret name of the grant for logs and tests:
// the first 6 bytes of the hash in hex, "" for no token. It identifies a
// grant, never lets anyone write.
func (h TokenHash) Fingerprint() string {
	if h.IsZero() {
		return ""
	}
	return hex.EncodeToString(h[:6])
}

// Value stores the hash as 32 bytes, or as the empty byte string for no
// token (never NULL: the fence compares with '=', which NULL never meets).
func (h TokenHash) Value() (driver.Value, error) {
	if h.IsZero() {
		return []byte{}, nil
	}
	return h[:], nil
}

// Scan reads a stored hash: 32 bytes, or empty for no token.
func (h *TokenHash) Scan(src any) error {
	var b []byte
	switch v := src.(type) {
	case []byte:
		b = v
	case string:
		b = []byte(v)
	case nil:
	default:
		return fmt.Errorf("cannot scan %T as a lease token hash", src)
	}
	switch len(b) {
	case 0:
		*h = TokenHash{}
	case len(h):
		copy(h[:], b)
	default:
		return fmt.Errorf("lease token hash of %d bytes, want %d", len(b), len(h))
	}
	return nil
}
