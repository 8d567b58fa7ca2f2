# attacks: graphql.is_valid of a query selecting one field 16,384 times: the overlapping-fields rule compares every pair
# expect: deny
package wb.admission

f0 := "a a a a a a a a a a a a a a a a "

f1 := concat("", [f0, f0, f0, f0, f0, f0, f0, f0, f0, f0, f0, f0, f0, f0, f0, f0])

f2 := concat("", [f1, f1, f1, f1, f1, f1, f1, f1, f1, f1, f1, f1, f1, f1, f1, f1])

query := concat("", ["{ ", f2, f2, f2, f2, "}"])

deny contains "never" if not graphql.is_valid(query, "type Query { a: Int }")
