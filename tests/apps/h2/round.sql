-- One round of the H2 workload: inserts, an update, joins, aggregates, a window function, a
-- correlated subquery, string functions and deletes, on tables setup.sql created.
INSERT INTO orders SELECT NEXT VALUE FOR order_ids, MOD(X * 7919, 5000) + 1, MOD(X * 104729, 800) + 1,
    MOD(X, 9) + 1, DATEADD('MINUTE', X, TIMESTAMP '2024-01-01 00:00:00'), 'note ' || RAWTOHEX(CAST(X AS VARCHAR)) FROM SYSTEM_RANGE(1, 8000);
UPDATE orders SET quantity = quantity + 1 WHERE MOD(id, 13) = 0;
SELECT c.region, p.category, COUNT(*), SUM(o.quantity * p.price) FROM orders o
    JOIN customers c ON c.id = o.customer JOIN products p ON p.id = o.product
    GROUP BY c.region, p.category ORDER BY 4 DESC LIMIT 20;
SELECT customer, total, RANK() OVER (ORDER BY total DESC) FROM
    (SELECT o.customer, SUM(o.quantity * p.price) AS total FROM orders o JOIN products p ON p.id = o.product
     GROUP BY o.customer) t ORDER BY 3 LIMIT 10;
SELECT COUNT(*) FROM orders o WHERE o.quantity > (SELECT AVG(o2.quantity) FROM orders o2 WHERE o2.product = o.product);
SELECT UPPER(SUBSTRING(c.name, 1, 12)), COUNT(DISTINCT o.product) FROM customers c JOIN orders o ON o.customer = c.id
    WHERE c.name LIKE 'customer-1%' GROUP BY c.name HAVING COUNT(*) > 2 ORDER BY 2 DESC LIMIT 10;
SELECT EXTRACT(HOUR FROM placed) AS h, AVG(quantity), MAX(note) FROM orders GROUP BY h ORDER BY h;
DELETE FROM orders WHERE id < (SELECT MAX(id) FROM orders) - 30000;
