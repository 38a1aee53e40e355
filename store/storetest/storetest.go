// Package storetest is the one conformance suite every store backend must pass.
// A backend's test calls Run with a function that opens a fresh, empty store;
// nothing backend-specific is tested only once. The tests name the rules of
// DESIGN.md they guard.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobfence/jobfence/store"
)

// LeaseExpirer is the test seam every backend of the suite provides beside
// store.Store: end a running job's lease now by the database clock, as if
// it had run out, which only opens the job to takeover (R8). Test data
// expires leases this way, never by moving a clock (T1).
type LeaseExpirer interface {
	ExpireLease(ctx context.Context, jobID int64) error
}

// Expire ends job jobID's lease through s's LeaseExpirer. Errors:
// store.ErrNotFound, store.ErrNotRunning, or a store without the seam.
func Expire(ctx context.Context, s store.Store, jobID int64) error {
	e, ok := s.(LeaseExpirer)
	if !ok {
		return fmt.Errorf("storetest: %T cannot expire leases (no ExpireLease)", s)
	}
	return e.ExpireLease(ctx, jobID)
}

// Opener returns a fresh, empty, migrated store for one test and registers its
// cleanup on t.
type Opener func(t *testing.T) store.Store

// Run runs the whole suite against the backend that open creates.
func Run(t *testing.T, open Opener) {
	tests := []struct {
		name string
		fn   func(*testing.T, store.Store)
	}{
		{"EnqueueIsIdempotentPerKey_R1", testEnqueueIdempotent},
		{"EnqueueConflictingValuesRejected_R1", testEnqueueConflict},
		{"EnqueueNotBeforeDefersClaim", testEnqueueNotBefore},
		{"EnqueueManyAnswersEachOnItsOwn_R1", testEnqueueManyEachOnItsOwn},
		{"EnqueueAndClaimTakesOldestDueFirst_Q1_R5", testEnqueueAndClaim},
		{"HistoryAppendedOnceATransaction_R3", testHistoryAppendedOnce},
		{"BadInputRejectedNothingWritten", testBadInput},
		{"ClaimBumpsAttemptUnderDBClock_R2_R5_R12", testClaimBumps},
		{"ClaimOrderStableAndBounded_Q1_Q4_R23", testClaimOrder},
		{"ClaimProviderFilter", testClaimProvider},
		{"ClaimEmptyIsNotAnError", testClaimEmpty},
		{"HasWorkLooksWithoutClaiming", testHasWorkLooksWithoutClaiming},
		{"TakeoverForcesReconcile_R6_R22", testTakeoverForcesReconcile},
		{"TakeoversComeFirst_R23", testTakeoversFirst},
		{"ZombieLateWritesAffectNothing_T1", testZombieT1},
		{"LeaseExpiredNobodyTookOver_T2_R8", testLeaseExpiredNoTakeoverT2},
		{"CommitThenLostReplyReplays_T4_R21", testLostReplyReplayT4},
		{"DifferentWriteSameAttemptNotRunning_R21", testDifferentWriteNotRunning},
		{"EveryGrantMintsAToken_R25", testEveryGrantMintsAToken},
		{"CurrentAttemptWithoutItsTokenRefused_R25", testCurrentAttemptWithoutItsTokenRefused_R25},
		{"BatchFencesEachWriteByItsToken_R25", testBatchFencesEachWriteByItsToken_R25},
		{"ObservationVerifiedByToken_R25", testObservationVerifiedByToken_R25},
		{"WriteManyAnswersEachOnItsOwn_R9_R21", testWriteManyEachOnItsOwn},
		{"ClaimManyNeverShares_R5_R23", testClaimManyEachOnItsOwn},
		{"RescheduleReturnsToReady", testReschedule},
		{"EscalateToManualReview_R16", testEscalate},
		{"ResolveReviewFencedByAttempt", testResolveReview},
		{"WriteUnknownJobOrUngrantedAttemptIsStale_R26", testWriteUnknown},
		{"ObservationsDedupedNeverChangeJob_R15", testObservations},
		{"ClaimCarriesObservations_R15", testClaimCarriesObservations},
		{"ObservationsPaged_R15", testObservationsPaged_R15},
		{"ObservationRoomPerJob_R28", testObservationRoomPerJob_R28},
		{"ArchivedJobStaysKnown_R30_R31", testArchivedJobStaysKnown_R30_R31},
		{"ArchiveKeepsUnfinishedWork_R31", testArchiveKeepsUnfinishedWork_R31},
		{"ArchiverLeaseFenced_R31", testArchiverLeaseFenced_R31},
		{"EnqueueRacesArchive_R30", testEnqueueRacesArchive_R30},
		{"ReceiptExpeditesReadyJob_R28", testReceiptExpeditesReadyJob_R28},
		{"ReceiptNeverSendsEarly_R28", testReceiptNeverSendsEarly_R28},
		{"ReceiptLeavesOtherStatesAlone_R28", testReceiptLeavesOtherStatesAlone_R28},
		{"ReceiptRacesClaim_R28", testReceiptRacesClaim_R28},
		{"ReceiptDuringGrantExpeditesReschedule_R28", testReceiptDuringGrantExpeditesReschedule_R28},
		{"RenewalExtendsTheSameGrant_R27", testRenewalExtendsTheSameGrant_R27},
		{"RenewalAfterExpiryBeforeTakeover_R8_R27", testRenewalAfterExpiryBeforeTakeover_R8_R27},
		{"RenewalRefusedWithoutTheGrant_R25_R27", testRenewalRefusedWithoutTheGrant_R25_R27},
		{"RenewManyAnswersEachOnItsOwn_R27", testRenewManyAnswersEachOnItsOwn_R27},
		{"RenewalBoundedByGrantAge_R27", testRenewalBoundedByGrantAge_R27},
		{"RenewalRacesTakeover_R27", testRenewalRacesTakeover_R27},
		{"UnmatchedKeptNeverDropped_R28", testUnmatchedKeptNeverDropped_R28},
		{"UnmatchedNewestFirstBounded_R28", testUnmatchedNewestFirstBounded_R28},
		{"ExpireLeaseOnlyRunning", testExpireLease},
		{"RunningJobDueAtItsLeaseEnd_R6_R23", testRunningJobDueAtItsLeaseEnd_R6_R23},
		{"ListJobsKeyset_Q4_Q7", testListJobsKeyset},
		{"ListJobsByPaymentNewestFirst", testListJobsByPayment},
		{"ListJobsByProviderRefundIDOwnOrReceipt_R15", testListJobsByProviderRefundID_R15},
		{"ListJobsOneLookupAtATime", testListJobsOneLookupAtATime},
		{"ListJobsReasonPrefixByteForByte", testListJobsReasonPrefix},
		{"ListJobsCreatedRange", testListJobsCreatedRange},
		{"ListJobsCountsReceiptsPerJob_R15", testListJobsObservationCounts_R15},
		{"GetReadsLedgerAndClock_R10_R12", testGetReadsLedgerAndClock_R10_R12},
		{"RecentTakeoversNewestFirst_M1", testRecentTakeovers_M1},
		{"RecentTakeoversWindowBounded_M1_Q3", testRecentTakeoversWindowBounded_M1_Q3},
		{"ActivityCountsPerMinute_M1_Q3", testActivityCountsPerMinute_M1_Q3},
		{"BudgetsListedRefilled_R19", testBudgetsListedRefilled_R19},
		{"ProviderBudgetCapsGrants_R19", testProviderBudget},
		{"StatsLeaveHistoryOut_M1", testStats},
		{"ConcurrentClaimersFenced_R2_R5_R9", testConcurrentClaimers},
		{"ClaimsAndWritebacksDoNotContend_R13_R20", testClaimsAndWritebacksDoNotContend},
		{"CancelNeverSentIsFinal_R32", testCancelNeverSentIsFinal_R32},
		{"CancelRunningFencesHolder_R32_R34", testCancelRunningFencesHolder_R32},
		{"CancelMaybeSentWaitsForAPerson_R32", testCancelMaybeSentWaitsForAPerson_R32},
		{"CancelRacesClaim_R32", testCancelRacesClaim_R32},
		{"PauseStopsGrants_R33", testPauseStopsGrants_R33},
		{"ReceiptAfterSuccessRaisesAttention_R34", testReceiptAfterSuccessRaisesAttention_R34},
		{"CancelledJobsArchived_R31_R32", testCancelledJobsArchived_R31_R32},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, open(t))
		})
	}
}

var keySeq atomic.Int64

// runID keeps keys of separate runs apart.
var runID = strconv.FormatUint(rand.Uint64(), 36)

// dbNow is the database's clock (R12): times in test data are set from it,
// never from this process's clock.
func dbNow(t *testing.T, s store.Store) time.Time {
	t.Helper()
	st, err := s.Stats(ctxFor(t))
	if err != nil {
		t.Fatal(err)
	}
	return st.Now
}

// refund returns enqueue parameters with a key unique to this process.
func refund(t *testing.T) store.EnqueueParams {
	n := keySeq.Add(1)
	return store.EnqueueParams{
		OperationKey: fmt.Sprintf("refund-%s-%d", runID, n),
		OrderID:      fmt.Sprintf("order-%d", n),
		PaymentID:    fmt.Sprintf("pay-%d", n),
		AmountMinor:  1250,
		Currency:     "EUR",
		Provider:     "acme",
	}
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func enqueue(t *testing.T, s store.Store, p store.EnqueueParams) store.Job {
	t.Helper()
	job, created, err := s.Enqueue(ctxFor(t), p)
	if err != nil || !created {
		t.Fatalf("Enqueue(%s) = created %v, %v", p.OperationKey, created, err)
	}
	return job
}

func claim(t *testing.T, s store.Store, worker string, max int) []store.ClaimedJob {
	t.Helper()
	got, err := s.Claim(ctxFor(t), store.ClaimParams{WorkerID: worker, MaxJobs: max, Lease: 30 * time.Second})
	if err != nil {
		t.Fatalf("Claim(%s): %v", worker, err)
	}
	return got
}

// claimOne claims and requires exactly the job id.
func claimOne(t *testing.T, s store.Store, worker string, id int64) store.ClaimedJob {
	t.Helper()
	got := claim(t, s, worker, 1)
	if len(got) != 1 || got[0].Job.ID != id {
		t.Fatalf("Claim(%s) = %v, want job %d", worker, ids(got), id)
	}
	return got[0]
}

func expire(t *testing.T, s store.Store, id int64) {
	t.Helper()
	if err := Expire(ctxFor(t), s, id); err != nil {
		t.Fatalf("ExpireLease(%d): %v", id, err)
	}
}

func get(t *testing.T, s store.Store, id int64) store.JobDetail {
	t.Helper()
	d, err := s.Get(ctxFor(t), store.GetParams{JobRef: store.JobRef{ID: id}})
	if err != nil {
		t.Fatalf("Get(%d): %v", id, err)
	}
	return d
}

// grant is what a write-back carries to prove it holds a job: the job, the
// attempt and the lease token of the grant (R9, R25).
type grant struct {
	id      int64
	attempt int64
	token   store.LeaseToken
}

// of is the grant a claim returned.
func of(c store.ClaimedJob) grant { return grant{c.Job.ID, c.Job.Attempt, c.LeaseToken} }

func complete(g grant, refundID string) store.Writeback {
	return store.Writeback{Kind: store.EventCompleted, JobID: g.id, Attempt: g.attempt, LeaseToken: g.token,
		ProviderRefundID: refundID}
}

func reschedule(g grant, delay time.Duration) store.Writeback {
	return store.Writeback{Kind: store.EventRescheduled, JobID: g.id, Attempt: g.attempt, LeaseToken: g.token,
		NextAction: store.ActionReconcile, Delay: delay, Reason: "provider pending"}
}

func escalate(g grant) store.Writeback {
	return store.Writeback{Kind: store.EventEscalated, JobID: g.id, Attempt: g.attempt, LeaseToken: g.token,
		Reason: "no record outside window"}
}

func write(t *testing.T, s store.Store, w store.Writeback) store.WriteResult {
	t.Helper()
	res, err := s.Write(ctxFor(t), w)
	if err != nil {
		t.Fatalf("Write(%s job %d attempt %d): %v", w.Kind, w.JobID, w.Attempt, err)
	}
	return res
}

// wantFence requires a *FenceError matching target with the current attempt and state.
func wantFence(t *testing.T, err error, target error, attempt int64, state store.State) {
	t.Helper()
	var fe *store.FenceError
	if !errors.Is(err, target) || !errors.As(err, &fe) {
		t.Fatalf("err = %v, want %v", err, target)
	}
	if fe.Current.Attempt != attempt || fe.Current.State != state {
		t.Fatalf("FenceError current = attempt %d state %s, want attempt %d state %s",
			fe.Current.Attempt, fe.Current.State, attempt, state)
	}
}

func wantViolation(t *testing.T, err error, field string) {
	t.Helper()
	var ve *store.ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("err = %v, want a ValidationError on %s", err, field)
	}
	for _, v := range ve.Violations {
		if v.Field == field {
			return
		}
	}
	t.Fatalf("violations %+v do not name %s", ve.Violations, field)
}

func ids(cs []store.ClaimedJob) []int64 {
	out := make([]int64, len(cs))
	for i, c := range cs {
		out[i] = c.Job.ID
	}
	return out
}

func kinds(events []store.Event) []store.EventKind {
	out := make([]store.EventKind, len(events))
	for i, e := range events {
		out[i] = e.Kind
	}
	return out
}

func countKind(events []store.Event, kind store.EventKind) int {
	n := 0
	for _, e := range events {
		if e.Kind == kind {
			n++
		}
	}
	return n
}
