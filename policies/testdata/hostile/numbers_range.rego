# attacks: numbers.range(1, 1e9) allocates an array of a billion numbers in one call (8 GB)
# expect: deny
package wb.admission

deny contains "never" if count(numbers.range(1, 1e9)) < 0
