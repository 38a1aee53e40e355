package console

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"

	pb "github.com/jobfence/jobfence/gen/jobfence/v1"
)

// Every action on one job posts the attempt the page showed, which fences it
// (R29), and a reason or note, which the history keeps; each answers with a
// redirect to the page it came from carrying a one-time notice (post,
// redirect, get), so that a reload never repeats it.

// maxNote bounds an operator's reason, as the API does.
const maxNote = 1024

// jobAction reads what an action on a job posts: the job's id from the path
// and the attempt the page showed. back is the job's page. ok is false when
// the person has been answered already.
func (c *Console) jobAction(w http.ResponseWriter, r *http.Request, s *session) (id, attempt int64, back string, ok bool) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		c.fail(w, r, s, http.StatusNotFound, "No such job.")
		return 0, 0, "", false
	}
	back = "/jobs/" + strconv.FormatInt(id, 10)
	attempt, err = strconv.ParseInt(r.PostFormValue("attempt"), 10, 64)
	if err != nil || attempt < 0 {
		c.fail(w, r, s, http.StatusBadRequest, "The form carries no attempt: open the job again.")
		return 0, 0, "", false
	}
	return id, attempt, back, true
}

// note reads the required reason of an action from field: when it is
// missing or too long, the person is sent back to back with a notice, and
// ok is false.
func (c *Console) note(w http.ResponseWriter, r *http.Request, s *session, field, back string) (string, bool) {
	note := strings.TrimSpace(r.PostFormValue(field))
	if note == "" || len(note) > maxNote {
		s.setFlash("error", fmt.Sprintf("A reason is required (up to %d characters). Nothing was changed.", maxNote))
		http.Redirect(w, r, back, http.StatusSeeOther)
		return "", false
	}
	return note, true
}

// report tells the person what their action came to, as a notice on back,
// and sends them there: done when it succeeded; else the coordinator's
// refusal in their words, stale replacing the words of STALE_ATTEMPT when
// set (what "someone acted first" means depends on the action). A
// credential the coordinator no longer accepts for it ends on the error
// page instead.
func (c *Console) report(w http.ResponseWriter, r *http.Request, s *session, back string, err error, done, stale string) {
	switch e := explain(err); {
	case err == nil:
		s.setFlash("ok", done)
	case e.reason == pb.ErrorReason_ERROR_REASON_UNAUTHENTICATED || e.httpStatus == http.StatusForbidden:
		c.failAPI(w, r, s, err)
		return
	case e.reason == pb.ErrorReason_ERROR_REASON_STALE_ATTEMPT && stale != "":
		s.setFlash("conflict", stale)
	case e.httpStatus == http.StatusConflict:
		s.setFlash("conflict", e.text)
	default:
		s.setFlash("error", e.text)
	}
	http.Redirect(w, r, back, http.StatusSeeOther)
}
