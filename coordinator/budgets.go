package coordinator

import "github.com/allot-dev/allot/budgets"

// The budgets document lives in package budgets, which the simulator reads
// too without the coordinator's gRPC and etcd; these names keep the
// coordinator's API.
type (
	// Document is budgets.Document.
	Document = budgets.Document
	// BudgetDocument is budgets.BudgetDocument.
	BudgetDocument = budgets.BudgetDocument
	// LeaseDocument is budgets.LeaseDocument.
	LeaseDocument = budgets.LeaseDocument
	// RulesBudgets is budgets.RulesBudgets.
	RulesBudgets = budgets.RulesBudgets
	// DocumentError is budgets.DocumentError.
	DocumentError = budgets.DocumentError
)

// ErrInvalidDocument is budgets.ErrInvalidDocument.
var ErrInvalidDocument = budgets.ErrInvalidDocument

// ParseDocument is budgets.ParseDocument.
func ParseDocument(data []byte, name string) (*Document, error) {
	return budgets.ParseDocument(data, name)
}

// LoadDocument is budgets.LoadDocument.
func LoadDocument(path string) (*Document, error) { return budgets.LoadDocument(path) }
