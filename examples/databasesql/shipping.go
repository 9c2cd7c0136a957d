// Package shipping shows pgbaton in the transactions of database/sql
// stacks: the same unit of work written once with GORM and once with sqlx
// (on pgx's stdlib driver or lib/pq). Each runs, in the caller's own
// transaction:
//
//   - fencedwrite.MarkProcessed: the message is handled exactly once;
//   - advisory's XactLock on the order: one writer per order at a time;
//   - fencedwrite.GuardLease and a fenced value (the shipping cursor):
//     a worker whose lease was taken over writes nothing;
//   - leasetable's CompleteTx: the work item is completed in the same
//     commit as its effect.
//
// The *sql.Tx goes to pgbaton through databasesql.Wrap; everything else
// is the ORM's usual code.
package shipping

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"

	"github.com/jmoiron/sqlx"
	"gorm.io/gorm"

	"github.com/pgbaton/pgbaton/advisory"
	"github.com/pgbaton/pgbaton/databasesql"
	"github.com/pgbaton/pgbaton/fencedwrite"
	"github.com/pgbaton/pgbaton/leasetable"
)

// Schema is the example's table.
const Schema = `CREATE TABLE shipment (order_id text PRIMARY KEY, carrier text NOT NULL, token bigint NOT NULL)`

// Shipment is a row of the shipment table (GORM's model, sqlx's struct).
type Shipment struct {
	OrderID string `gorm:"primaryKey" db:"order_id"`
	Carrier string `db:"carrier"`
	Token   int64  `db:"token"`
}

// Worker ships orders: each order is a work item claimed from leases.
type Worker struct {
	Locker *advisory.Locker
	Leases *leasetable.Client
}

// Message asks to ship the order that item (a claimed work item named
// after the order) stands for.
type Message struct {
	ID      string
	Carrier string
}

// Cursor is the fenced value the worker moves with every shipment.
const Cursor = "shipping:cursor"

// inTx is what the GORM and the sqlx variants share: the pgbaton calls on
// the wrapped transaction around the ORM's own write.
func (w *Worker) inTx(ctx context.Context, tx *sql.Tx, item *leasetable.Lease, msg Message, write func() error) error {
	ptx := databasesql.Wrap(tx)
	if err := fencedwrite.MarkProcessed(ctx, ptx, "shipping", msg.ID); err != nil {
		return err
	}
	if err := w.Locker.XactLock(ctx, ptx, advisory.Name("order:"+item.Name())); err != nil {
		return err
	}
	if err := fencedwrite.GuardLease(ctx, ptx, item); err != nil {
		return err
	}
	if err := write(); err != nil {
		return err
	}
	cursor, _ := json.Marshal(map[string]string{"last": item.Name()})
	if _, err := fencedwrite.PutValue(ctx, databasesql.WrapQuerier(tx), Cursor, item.Token(), cursor); err != nil {
		return err
	}
	return w.Leases.CompleteTx(ctx, ptx, item)
}

// ShipGORM handles msg for item in a GORM transaction.
func (w *Worker) ShipGORM(ctx context.Context, db *gorm.DB, item *leasetable.Lease, msg Message) error {
	return db.WithContext(ctx).Transaction(func(gtx *gorm.DB) error {
		tx, ok := gtx.Statement.ConnPool.(*sql.Tx)
		if !ok {
			return fmt.Errorf("shipping: GORM transaction on %T, not a *sql.Tx", gtx.Statement.ConnPool)
		}
		return w.inTx(ctx, tx, item, msg, func() error {
			return gtx.Create(&Shipment{OrderID: item.Name(), Carrier: msg.Carrier, Token: item.Token()}).Error
		})
	})
}

// ShipSQLX handles msg for item in an sqlx transaction.
func (w *Worker) ShipSQLX(ctx context.Context, db *sqlx.DB, item *leasetable.Lease, msg Message) error {
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }() // after Commit: sql.ErrTxDone, ignored
	err = w.inTx(ctx, tx.Tx, item, msg, func() error {
		_, err := tx.NamedExecContext(ctx, `INSERT INTO shipment (order_id, carrier, token) VALUES (:order_id, :carrier, :token)`,
			Shipment{OrderID: item.Name(), Carrier: msg.Carrier, Token: item.Token()})
		return err
	})
	if err != nil {
		return err
	}
	return tx.Commit()
}

// TableName keeps GORM on the example's table name.
func (Shipment) TableName() string { return "shipment" }
